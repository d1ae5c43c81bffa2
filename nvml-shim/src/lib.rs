//! nvml-shim: a stand-in `libnvidia-ml.so.1`. It implements the NVML C ABI for device
//! enumeration and the MIG API (GPU/compute instances, MIG device handles) over a model of
//! A100-40GB, A100-80GB, H100-80GB and H200-141GB MIG geometry. State is shared between
//! processes through a flock'ed JSON file; see README.md.
//!
//! Every exported function catches panics (returns NVML_ERROR_UNKNOWN) and validates every
//! handle against a registry of the pointers it handed out.

pub mod config;
pub mod ffi;
pub mod holders;
pub mod layout;
pub mod model;
pub mod ret;
pub mod state;
pub mod store;
#[allow(non_snake_case)]
mod unsupported;

pub use config::Config;
pub use model::GpuModel;
pub use ret::Ret;
pub use state::State;
