// How the NVML stand-in is linked: build-support/link.rs. GCC's unwinder is linked in (as C's
// -static-libgcc), so that loading the library does not load libgcc_s.so.1 and run its CPU-model
// constructor: the real libnvidia-ml.so.1 needs no libgcc_s either, and the prolog and epilog
// that load NVML for a MIG job start once per job (BENCHMARKS.md).
include!("../crates/build-support/link.rs");

fn main() {
    if let Some(dir) = link_dirs() {
        static_libgcc(&dir);
    }
}
