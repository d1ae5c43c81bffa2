//! tenancy-e2e
