//! tenancy-node
