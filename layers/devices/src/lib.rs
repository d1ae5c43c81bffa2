//! tenancy-devices
