# Sourced by the scripts: Rust on PATH, and build for x86-64-v3 (AVX2) where the CPU has it.
# XXH3 picks AVX2 at run time anyway (twox-hash); the rest of the code (content generation,
# copies) still gains from the wider baseline.
export PATH="$HOME/.cargo/bin:$PATH"
if [ -z "${RUSTFLAGS+x}" ] && [ "$(uname -m)" = x86_64 ]; then
  v3=1
  for f in avx avx2 bmi1 bmi2 f16c fma abm movbe xsave; do grep -qw "$f" /proc/cpuinfo || v3=0; done
  [ "$v3" = 1 ] && export RUSTFLAGS="-C target-cpu=x86-64-v3"
fi
