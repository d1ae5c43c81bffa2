//! spank-tenancy
