//! Errors of the devices layer. Every variant names the value at fault and, where it helps,
//! what the operator should do.

use std::path::PathBuf;

/// Errors of the devices layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A driver information file could not be read.
    #[error("devices layer: cannot read {path}: {source} (is the NVIDIA driver loaded? pass the right path)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A driver information file has a line we do not understand (fail closed).
    #[error("devices layer: {path} line {line}: {msg}: {text:?}")]
    Parse {
        path: PathBuf,
        line: usize,
        msg: String,
        text: String,
    },
    /// A device class string (config) is invalid.
    #[error("devices layer: invalid device class {text:?}: {msg} (expected e.g. \"c 1:* rwm\")")]
    BadClass { text: String, msg: String },
    /// The job asks for something the driver does not provide.
    #[error("devices layer: {0}")]
    Policy(String),
    /// A name that would become part of a cgroup path is unsafe.
    #[error("devices layer: invalid {what} {value:?}: {msg}")]
    BadName {
        what: &'static str,
        value: String,
        msg: String,
    },
    /// A cgroup file operation failed.
    #[error("devices layer: {op} {path}: {source}")]
    Cgroup {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A bpf(2) command failed.
    #[error("devices layer: bpf({cmd}) failed for {what}: {source}{log}")]
    Bpf {
        cmd: &'static str,
        what: String,
        #[source]
        source: std::io::Error,
        /// Verifier log, if any.
        log: String,
    },
    /// No cgroup hierarchy that can control devices was found.
    #[error("devices layer: {0}")]
    Layout(String),
    /// A capability device node of the job's slice could not be made.
    #[error("devices layer: cannot make the capability device node {path} (c {major}:{minor}): {source}; the prolog makes it as root (CAP_MKNOD) so the job needs no mknod: check that the prolog runs as root and {path} is not a symlink")]
    CapNode {
        path: PathBuf,
        major: u32,
        minor: u32,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn cgroup(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Cgroup {
            op,
            path: path.into(),
            source,
        }
    }
}

impl From<tenancy_cgroup::layout::ReadError> for Error {
    fn from(e: tenancy_cgroup::layout::ReadError) -> Self {
        Error::Read {
            path: e.path,
            source: e.source,
        }
    }
}

impl From<tenancy_cgroup::CgroupError> for Error {
    fn from(e: tenancy_cgroup::CgroupError) -> Self {
        let source = std::io::Error::new(e.source.kind(), e.reason());
        Error::Cgroup {
            op: e.op,
            path: e.path,
            source,
        }
    }
}

impl From<tenancy_config::device_class::BadClass> for Error {
    fn from(e: tenancy_config::device_class::BadClass) -> Self {
        Error::BadClass {
            text: e.text,
            msg: e.msg,
        }
    }
}
