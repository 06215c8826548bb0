"""Plain BPE training for the oracles that write their own vocabularies (the GGUF tokenizer
oracle and the tiny GGUF of each architecture): a fixed text gives fixed merges, and
nothing is downloaded."""


def train_merges(words, count):
    """Plain BPE: `count` merges of the most frequent adjacent pair (ties: the smallest)."""
    seqs = {}
    for w in words:
        seqs[tuple(w)] = seqs.get(tuple(w), 0) + 1
    merges = []
    for _ in range(count):
        pairs = {}
        for s, n in seqs.items():
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for s, n in seqs.items():
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        seqs = merged
    return merges
