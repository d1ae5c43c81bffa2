//! tenancy-mig
