include!("../build-support/static_libgcc.rs");
