#include "text/bpe.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "common/error.hpp"
#include "text/unicode.hpp"

namespace computron::text {

namespace {

std::atomic<uint64_t> next_uid{1};

/// Words at least this long are encoded every time, as `tokenizers` does: long runs
/// (a line of CJK text is one word) rarely repeat and would crowd the cache out.
constexpr size_t max_cached_word = 256;
/// Entries one thread keeps per model before it starts afresh.
constexpr size_t max_cached_words = 1 << 14;
/// Models one thread keeps caches for (tokenizers are few and long-lived).
constexpr size_t max_cached_models = 4;

/// One thread's cache for one model: word -> ids. Keys live in fixed chunks so that the
/// map's views stay valid as it grows; a lookup allocates nothing.
struct word_cache {
  uint64_t uid = 0;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> map;  // offset, count
  std::vector<int32_t> ids;
  std::vector<std::unique_ptr<char[]>> chunks;
  size_t used = chunk_size;
  static constexpr size_t chunk_size = 1 << 16;

  std::string_view keep(std::string_view word) {
    if (used + word.size() > chunk_size) {
      chunks.push_back(std::make_unique<char[]>(chunk_size));
      used = 0;
    }
    char* at = chunks.back().get() + used;
    std::memcpy(at, word.data(), word.size());
    used += word.size();
    return {at, word.size()};
  }
  void clear() {
    map.clear();
    ids.clear();
    chunks.clear();
    used = chunk_size;
  }
};

word_cache& cache_of(uint64_t uid) {
  thread_local std::vector<std::unique_ptr<word_cache>> caches;
  for (auto& c : caches)
    if (c->uid == uid) return *c;
  if (caches.size() >= max_cached_models) caches.erase(caches.begin());
  caches.push_back(std::make_unique<word_cache>());
  caches.back()->uid = uid;
  return *caches.back();
}

struct symbol {
  int32_t id;
  int32_t prev, next;
  uint32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

/// A queued merge: lowest rank first, leftmost first among equals (tokenizers' Merge
/// ordering), packed in one integer so that the heap compares one number.
struct pending_merge {
  uint64_t order;  // rank << 32 | position
  int32_t new_id;
  uint32_t pos() const { return static_cast<uint32_t>(order); }
};

struct later {
  bool operator()(const pending_merge& a, const pending_merge& b) const {
    return a.order > b.order;
  }
};

pending_merge queued(int32_t rank, uint32_t pos, int32_t new_id) {
  return {(static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 32) | pos, new_id};
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

caf::error bad(const std::string& why) {
  return make_error(ec::invalid_configuration, why);
}

}  // namespace

void token_table::build(const std::string* arena,
                        const std::vector<std::pair<uint32_t, uint32_t>>& spans,
                        const std::vector<int32_t>& ids) {
  arena_ = arena;
  size_t cap = 16;
  while (cap < ids.size() * 2) cap *= 2;
  slots_.assign(cap, slot{});
  mask_ = cap - 1;
  for (auto id : ids) {
    auto [off, len] = spans[static_cast<size_t>(id)];
    std::string_view key{arena->data() + off, len};
    auto h = std::hash<std::string_view>{}(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      auto& s = slots_[i];
      if (s.id < 0) {
        s = {off, len, id, static_cast<uint32_t>(h)};
        break;
      }
      if (s.hash == static_cast<uint32_t>(h) && s.len == len &&
          arena->compare(s.off, s.len, key) == 0) {
        s.id = id;  // the same token twice: the last id, as a JSON object keeps it
        s.off = off;
        break;
      }
    }
  }
}

int32_t token_table::find(std::string_view token) const {
  if (slots_.empty()) return -1;
  auto h = std::hash<std::string_view>{}(token);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    auto& s = slots_[i];
    if (s.id < 0) return -1;
    if (s.hash == static_cast<uint32_t>(h) && s.len == token.size() &&
        std::memcmp(arena_->data() + s.off, token.data(), token.size()) == 0)
      return s.id;
  }
}

void merge_table::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap *= 2;
  slots_.assign(cap, slot{});
  mask_ = cap - 1;
  used_ = 0;
}

void merge_table::set(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  if ((used_ + 1) * 2 > slots_.size()) {  // grow: rehash what is there
    auto old = std::move(slots_);
    reserve(std::max<size_t>(used_ + 1, old.size()));
    for (auto& s : old)
      if (s.key != ~uint64_t{0})
        set(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFF),
            s.rule.first, s.rule.second);
  }
  auto key = pair_key(a, b);
  for (size_t i = (key * 0x9E3779B97F4A7C15ULL >> 20) & mask_;; i = (i + 1) & mask_) {
    auto& s = slots_[i];
    if (s.key == ~uint64_t{0}) {
      s.key = key;
      ++used_;
    }
    if (s.key == key) {
      s.rule = {rank, merged};
      return;
    }
  }
}

const std::pair<int32_t, int32_t>* merge_table::find(int32_t a, int32_t b) const {
  if (slots_.empty()) return nullptr;
  auto key = pair_key(a, b);
  for (size_t i = (key * 0x9E3779B97F4A7C15ULL >> 20) & mask_;; i = (i + 1) & mask_) {
    auto& s = slots_[i];
    if (s.key == key) return &s.rule;
    if (s.key == ~uint64_t{0}) return nullptr;
  }
}

caf::expected<bpe_model> bpe_model::make(
    const std::vector<std::pair<std::string_view, int64_t>>& vocab,
    const std::vector<std::pair<std::string_view, std::string_view>>& merges, bpe_options options) {
  bpe_model m{std::move(options)};
  m.uid_ = next_uid++;
  int64_t top = -1;
  size_t bytes = 0;
  for (auto& [tok, id] : vocab) {
    if (id < 0 || id >= (int64_t{1} << 24))
      return bad("token '" + std::string{tok} + "' has no valid id (0 .. 2^24)");
    top = std::max(top, id);
    bytes += tok.size();
  }
  auto arena = std::make_shared<std::string>();
  arena->reserve(bytes);
  m.token_at_.assign(static_cast<size_t>(top + 1), {0, 0});
  std::vector<int32_t> ids;
  ids.reserve(vocab.size());
  for (auto& [tok, id] : vocab) {
    m.token_at_[static_cast<size_t>(id)] = {static_cast<uint32_t>(arena->size()),
                                            static_cast<uint32_t>(tok.size())};
    arena->append(tok);
    ids.push_back(static_cast<int32_t>(id));
  }
  m.arena_ = arena;
  m.ids_.build(arena.get(), m.token_at_, ids);
  for (int c = 0; c < 128; ++c) {
    char ch = static_cast<char>(c);
    m.ascii_[c] = m.ids_.find(std::string_view{&ch, 1});
  }
  static const char hex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    char name[] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    m.byte_ids_[b] = m.ids_.find(std::string_view{name, 6});
  }
  if (m.options_.unk_token) {
    m.unk_ = m.ids_.find(*m.options_.unk_token);
    if (m.unk_ < 0)
      return bad("the unknown token '" + *m.options_.unk_token + "' is not in the vocabulary");
  }
  // Boundary code points: tokens of one character that no token holds right after a
  // different character (runs of it, "▁▁▁", do not count).
  std::vector<bool> inner(0x110000, false), single(0x110000, false);
  for (auto& [tok, _] : vocab) {
    size_t i = 0;
    uint32_t prev = unicode::next_code_point(tok, i);
    if (i == tok.size() && prev < 0x110000) single[prev] = true;
    while (i < tok.size()) {
      uint32_t cp = unicode::next_code_point(tok, i);
      if (cp < 0x110000 && cp != prev) inner[cp] = true;
      prev = cp;
    }
  }
  for (uint32_t cp = 0x80; cp < 0x110000; ++cp)  // ASCII is left alone: it is rarely alone
    if (single[cp] && !inner[cp]) {
      if (m.boundary_.empty()) m.boundary_.assign(0x110000, false);
      m.boundary_[cp] = true;
    }
  m.merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto& [a, b] = merges[rank];
    joined.assign(a);
    joined.append(b);
    int32_t ia = m.ids_.find(a), ib = m.ids_.find(b), ij = m.ids_.find(joined);
    if (ia < 0 || ib < 0 || ij < 0) {
      auto missing = std::string{ia < 0 ? a : ib < 0 ? b : std::string_view{joined}};
      return bad("merge " + std::to_string(rank + 1) + " ('" + std::string{a} + " " +
                 std::string{b} + "'): '" + missing + "' is not in the vocabulary");
    }
    // A pair listed twice keeps its last rank, as tokenizers' map does.
    m.merges_.set(ia, ib, static_cast<int32_t>(rank), ij);
  }
  return m;
}

std::optional<int64_t> bpe_model::id_of(std::string_view token) const {
  auto id = ids_.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::string_view bpe_model::token_of(int64_t id) const {
  if (id < 0 || id >= size()) return {};
  auto [off, len] = token_at_[static_cast<size_t>(id)];
  return std::string_view{*arena_}.substr(off, len);
}

void bpe_model::merge(std::string_view word, std::vector<int32_t>& ids) const {
  thread_local std::vector<symbol> syms;
  thread_local std::vector<pending_merge> heap;
  syms.clear();
  heap.clear();
  auto add = [&](int32_t id, uint32_t len) {
    auto n = static_cast<int32_t>(syms.size());
    if (n > 0) syms.back().next = n;
    syms.push_back({id, n - 1, -1, len});
  };
  // An unknown run not yet added: its id and byte length (fuse_unk grows it).
  int32_t unk_id = -1;
  uint32_t unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    size_t len = unicode::char_length(word, i);
    auto c = static_cast<unsigned char>(word[i]);
    int32_t id = -1;
    if (len == 1 && c < 0x80) {
      id = ascii_[c];
    } else {
      id = ids_.find(word.substr(i, len));
    }
    if (id >= 0) {
      if (unk_id >= 0) add(unk_id, unk_len);
      unk_id = -1;
      add(id, static_cast<uint32_t>(len));
    } else {
      bool fell_back = false;
      if (options_.byte_fallback) {
        fell_back = true;
        for (size_t k = 0; k < len; ++k)
          fell_back = fell_back && byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
        // As in tokenizers, the byte tokens go in without first adding a pending unknown.
        for (size_t k = 0; fell_back && k < len; ++k)
          add(byte_ids_[static_cast<unsigned char>(word[i + k])], 1);
      }
      if (!fell_back && unk_ >= 0) {
        if (unk_id >= 0 && options_.fuse_unk) {
          unk_len += static_cast<uint32_t>(len);
        } else {
          if (unk_id >= 0) add(unk_id, unk_len);
          unk_id = unk_;
          unk_len = static_cast<uint32_t>(len);
        }
      }
    }
    i += len;
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  auto rule = [&](int32_t a, int32_t b) { return merges_.find(a, b); };
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (auto* r = rule(syms[k].id, syms[k + 1].id))
      heap.push_back(queued(r->first, static_cast<uint32_t>(k), r->second));
  std::make_heap(heap.begin(), heap.end(), later{});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later{});
    auto top = heap.back();
    heap.pop_back();
    auto& cur = syms[top.pos()];
    if (cur.len == 0 || cur.next == -1) continue;
    auto next_pos = static_cast<size_t>(cur.next);
    auto right = syms[next_pos];
    // A stale entry: the pair at this position has changed since it was queued.
    auto* now = rule(cur.id, right.id);
    if (!now || now->second != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    syms[next_pos].len = 0;
    if (right.next >= 0)
      syms[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos());
    auto& merged = syms[top.pos()];
    if (merged.prev >= 0)
      if (auto* r = rule(syms[static_cast<size_t>(merged.prev)].id, merged.id)) {
        heap.push_back(queued(r->first, static_cast<uint32_t>(merged.prev), r->second));
        std::push_heap(heap.begin(), heap.end(), later{});
      }
    if (merged.next >= 0)
      if (auto* r = rule(merged.id, syms[static_cast<size_t>(merged.next)].id)) {
        heap.push_back(queued(r->first, top.pos(), r->second));
        std::push_heap(heap.begin(), heap.end(), later{});
      }
  }
  for (auto& s : syms)
    if (s.len != 0) ids.push_back(s.id);
}

void bpe_model::merge_cached(std::string_view word, std::vector<int64_t>& out) const {
  if (word.size() >= max_cached_word) {
    thread_local std::vector<int32_t> ids;
    ids.clear();
    merge(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  auto& cache = cache_of(uid_);
  if (auto hit = cache.map.find(word); hit != cache.map.end()) {
    auto [off, n] = hit->second;
    out.insert(out.end(), cache.ids.begin() + off, cache.ids.begin() + off + n);
    return;
  }
  if (cache.map.size() >= max_cached_words) cache.clear();
  auto off = static_cast<uint32_t>(cache.ids.size());
  merge(word, cache.ids);
  auto n = static_cast<uint32_t>(cache.ids.size() - off);
  cache.map.emplace(cache.keep(word), std::make_pair(off, n));
  out.insert(out.end(), cache.ids.begin() + off, cache.ids.begin() + off + n);
}

void bpe_model::encode_word(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges)
    if (auto id = ids_.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  if (word.size() < max_cached_word || boundary_.empty()) {
    merge_cached(word, out);
    return;
  }
  // A long word (a whole text, where there is no pre-tokenizer): cut before each boundary
  // that follows another character.
  size_t from = 0;
  uint32_t prev = 0;
  for (size_t i = 0; i < word.size();) {
    size_t at = i;
    uint32_t cp = unicode::next_code_point(word, i);
    if (at > from && cp != prev && cp < boundary_.size() && boundary_[cp]) {
      merge_cached(word.substr(from, at - from), out);
      from = at;
    }
    prev = cp;
  }
  merge_cached(word.substr(from), out);
}

}  // namespace computron::text
