//! tenancy-network
