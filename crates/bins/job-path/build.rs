// How the three programs are linked: build-support/link.rs. tenancy-prolog and tenancy-epilog
// are static PIEs; tenancy-prolog-dynamic is linked dynamically, against glibc, so that it can
// load NVML and NSS modules. All three take libgcc's unwinder statically.
include!("../../build-support/link.rs");

fn main() {
    if let Some(dirs) = link_dirs() {
        if static_libgcc(&dirs) {
            static_glibc(&dirs, "tenancy-prolog", "TENANCY_DYNAMIC_PROLOG");
            static_glibc(&dirs, "tenancy-epilog", "TENANCY_DYNAMIC_EPILOG");
        }
    }
}
