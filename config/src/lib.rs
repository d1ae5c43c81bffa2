//! tenancy-config
