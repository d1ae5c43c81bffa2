//! What this crate's test files share: tenancy-test-support's users, groups and scratch tree.

#[allow(unused_imports)] // (not every test file of the crate uses each)
pub use tenancy_test_support::users::*;
#[allow(unused_imports)]
pub use tenancy_test_support::{requires_root, seccomp, Immutable};
