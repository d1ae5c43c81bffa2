//! nvml-shim
