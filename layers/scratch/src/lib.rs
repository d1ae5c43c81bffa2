//! tenancy-scratch
