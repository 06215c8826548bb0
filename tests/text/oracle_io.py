# The contract between the C++ oracle tests and the Python oracles beside this file
# (chat_template_oracle.py, tokenizer_oracle.py), the one the .mjs oracles keep too:
#
#   python3 <oracle>.py MODE IN OUT   answers IN (JSON) into OUT (JSON), then prints "done"
#
# The test waits for that line, so "done" is printed only once OUT is written and closed.
import json
import sys


def answer_files(argv, mode, usage, answer):
    """Runs `answer` on the request file of argv = [mode, IN, OUT] and writes what it
    returns to OUT; the exit status (2 and `usage` on stderr for any other argv)."""
    if len(argv) == 3 and argv[0] == mode:
        with open(argv[1], encoding="utf-8") as f:
            request = json.load(f)
        out = answer(request)
        with open(argv[2], "w", encoding="utf-8") as f:
            # ensure_ascii=False: the C++ side reads UTF-8 as it is, and a lone surrogate
            # cannot reach here (the request came in as JSON of valid UTF-8).
            json.dump(out, f, ensure_ascii=False)
        print("done", flush=True)
        return 0
    print("usage: " + usage, file=sys.stderr)
    return 2
