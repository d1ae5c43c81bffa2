#!/bin/sh
# What starting and ending a process costs on this machine before it does anything, the floor
# under every prolog and epilog (BENCHMARKS.md, "What is left"). Five small programs, each
# spawned and waited for as bench/driver.py does, cold (64 MiB read before each), N times
# (default 300); all but the last are static PIEs:
#   nolibc      `_start` calls exit: the kernel's exec, exit and wait alone
#   cpuid100    the same plus 100 CPUID instructions (a trap to the hypervisor in a VM)
#   bss100      the same plus 100 first writes to fresh pages (100 page faults)
#   glibc       `int main(void) { return 0; }` linked with glibc, as the prolog and epilog are
#   glibc-dyn   the same dynamically linked, as the shell and the commands of bench/baseline/
# Needs gcc and libc6-dev (libc.a, rcrt1.o: what the static prolog needs too); no root.
set -eu
N=${N:-300}
dir=$(mktemp -d /tmp/process-floor.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/nolibc.c" <<'EOF'
void _start(void) { __asm__ volatile("mov $60, %eax; xor %edi, %edi; syscall"); }
EOF
cat > "$dir/cpuid100.c" <<'EOF'
void _start(void) {
  for (int i = 0; i < 100; i++) {
    unsigned a = 4, b, c = i & 3, d;
    __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
  }
  __asm__ volatile("mov $60, %eax; xor %edi, %edi; syscall");
}
EOF
cat > "$dir/bss100.c" <<'EOF'
static char pages[100 * 4096];
void _start(void) {
  for (int i = 0; i < 100; i++) ((volatile char *)pages)[i * 4096] = 1;
  __asm__ volatile("mov $60, %eax; xor %edi, %edi; syscall");
}
EOF
echo 'int main(void) { return 0; }' > "$dir/glibc.c"
for p in nolibc cpuid100 bss100; do gcc -O2 -static-pie -nostdlib -o "$dir/$p" "$dir/$p.c"; done
gcc -O2 -static-pie -o "$dir/glibc" "$dir/glibc.c"
gcc -O2 -o "$dir/glibc-dyn" "$dir/glibc.c"
python3 - "$N" "$dir/nolibc" "$dir/cpuid100" "$dir/bss100" "$dir/glibc" "$dir/glibc-dyn" <<'EOF'
import os, statistics, sys, time
n, progs = int(sys.argv[1]), sys.argv[2:]
flush = bytearray(64 << 20)
rows = {p: [] for p in progs}
for _ in range(n):
    for p in progs:
        flush.count(b"\x02")  # evicts the CPU caches, as before every job in bench/driver.py
        t = time.perf_counter_ns()
        pid = os.posix_spawn(p, [p], {})
        _, _, ru = os.wait4(pid, 0)
        rows[p].append(((time.perf_counter_ns() - t) / 1e6, (ru.ru_utime + ru.ru_stime) * 1e3))
print(f"{'program':<10} {'wall med':>9} {'cpu med':>8}  (ms, {n} cold spawns each)")
for p in progs:
    w = statistics.median(r[0] for r in rows[p]); c = statistics.median(r[1] for r in rows[p])
    print(f"{os.path.basename(p):<10} {w:>9.3f} {c:>8.3f}")
EOF
