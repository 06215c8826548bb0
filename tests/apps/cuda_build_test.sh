#!/bin/sh
# The computron binary is the CUDA build on every machine (issue "One build for every
# machine"): it links libtorch_cuda and cudart, every library it needs resolves, and where no
# GPU is usable `computron devices --kind cuda` exits non-zero with one clear line, no crash.
#   cuda_build_test.sh COMPUTRON_BINARY
set -u
bin=$1
fail() { echo "cuda build check: $*" >&2; exit 1; }
libs=$(ldd "$bin") || fail "ldd $bin failed"
echo "$libs" | grep -q 'libtorch_cuda\.so' || fail "$bin does not link libtorch_cuda"
echo "$libs" | grep -q 'libcudart\.so' || fail "$bin does not link cudart"
echo "$libs" | grep -q 'libc10_cuda\.so' || fail "$bin does not link c10_cuda"
if echo "$libs" | grep -q 'not found'; then
  fail "unresolved libraries: $(echo "$libs" | grep 'not found' | tr '\n' ' ')"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # A GPU machine: the same binary must open the GPU.
  timeout 120 "$bin" devices --kind cuda >/dev/null 2>&1 || fail "devices --kind cuda failed on a GPU machine"
  echo "cuda build check: CUDA build, GPU opened"
  exit 0
fi
out=$(timeout 120 "$bin" devices --kind cuda 2>&1)
rc=$?
[ "$rc" -ne 0 ] || fail "devices --kind cuda succeeded without a GPU"
[ "$rc" -lt 124 ] || fail "devices --kind cuda ended with $rc (timeout or signal: a crash)"
lines=$(printf '%s\n' "$out" | grep -c .)
[ "$lines" -eq 1 ] || fail "expected one line, got $lines: $out"
printf '%s\n' "$out" | grep -qi 'cuda' || fail "the line does not name CUDA: $out"
echo "cuda build check: CUDA build; without a GPU: $out (exit $rc)"
