//! nvmlReturn_t values (nvml.h) and their names.

/// An NVML return code other than NVML_SUCCESS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ret(pub u32);

pub type NvmlResult<T> = Result<T, Ret>;

pub const SUCCESS: u32 = 0;

macro_rules! codes {
    ($($name:ident = $v:expr, $msg:expr;)*) => {
        impl Ret {
            $(pub const $name: Ret = Ret($v);)*
        }
        /// (code, short name, message) for every known code.
        pub const ALL: &[(u32, &str, &str)] = &[$(($v, stringify!($name), $msg)),*];
    };
}

codes! {
    UNINITIALIZED = 1, "Uninitialized";
    INVALID_ARGUMENT = 2, "Invalid Argument";
    NOT_SUPPORTED = 3, "Not Supported";
    NO_PERMISSION = 4, "Insufficient Permissions";
    ALREADY_INITIALIZED = 5, "Already Initialized";
    NOT_FOUND = 6, "Not Found";
    INSUFFICIENT_SIZE = 7, "Insufficient Size";
    INSUFFICIENT_POWER = 8, "Insufficient External Power";
    DRIVER_NOT_LOADED = 9, "Driver Not Loaded";
    TIMEOUT = 10, "Timeout";
    IRQ_ISSUE = 11, "Interrupt Request Issue";
    LIBRARY_NOT_FOUND = 12, "NVML Shared Library Not Found";
    FUNCTION_NOT_FOUND = 13, "Function Not Found";
    CORRUPTED_INFOROM = 14, "Corrupted infoROM";
    GPU_IS_LOST = 15, "GPU is lost";
    RESET_REQUIRED = 16, "GPU requires restart";
    OPERATING_SYSTEM = 17, "The operating system has blocked the request.";
    LIB_RM_VERSION_MISMATCH = 18, "RM has detected an NVML/RM version mismatch.";
    IN_USE = 19, "In use by another client";
    MEMORY = 20, "Insufficient Memory";
    NO_DATA = 21, "No data";
    VGPU_ECC_NOT_SUPPORTED = 22, "Not supported when ECC is enabled";
    INSUFFICIENT_RESOURCES = 23, "Insufficient resources";
    FREQ_NOT_SUPPORTED = 24, "Frequency not supported";
    ARGUMENT_VERSION_MISMATCH = 25, "Argument version mismatch";
    DEPRECATED = 26, "Deprecated";
    NOT_READY = 27, "Not ready";
    GPU_NOT_FOUND = 28, "GPU not found";
    INVALID_STATE = 29, "Invalid state";
    RESET_TYPE_NOT_SUPPORTED = 30, "Reset type not supported";
    UNKNOWN = 999, "Unknown Error";
}

impl Ret {
    pub fn name(self) -> &'static str {
        ALL.iter()
            .find(|(c, _, _)| *c == self.0)
            .map(|(_, n, _)| *n)
            .unwrap_or("UNKNOWN")
    }
}

impl std::fmt::Display for Ret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NVML_ERROR_{} ({})", self.name(), self.0)
    }
}

/// Message nvmlErrorString returns, NUL-terminated.
pub fn message(code: u32) -> &'static str {
    if code == SUCCESS {
        return "Success\0";
    }
    match code {
        1 => "Uninitialized\0",
        2 => "Invalid Argument\0",
        3 => "Not Supported\0",
        4 => "Insufficient Permissions\0",
        5 => "Already Initialized\0",
        6 => "Not Found\0",
        7 => "Insufficient Size\0",
        8 => "Insufficient External Power\0",
        9 => "Driver Not Loaded\0",
        10 => "Timeout\0",
        11 => "Interrupt Request Issue\0",
        12 => "NVML Shared Library Not Found\0",
        13 => "Function Not Found\0",
        14 => "Corrupted infoROM\0",
        15 => "GPU is lost\0",
        16 => "GPU requires restart\0",
        17 => "The operating system has blocked the request.\0",
        18 => "RM has detected an NVML/RM version mismatch.\0",
        19 => "In use by another client\0",
        20 => "Insufficient Memory\0",
        21 => "No data\0",
        22 => "Not supported when ECC is enabled\0",
        23 => "Insufficient resources\0",
        24 => "Frequency not supported\0",
        25 => "Argument version mismatch\0",
        26 => "Deprecated\0",
        27 => "Not ready\0",
        28 => "GPU not found\0",
        29 => "Invalid state\0",
        30 => "Reset type not supported\0",
        _ => "Unknown Error\0",
    }
}

/// Parses "INSUFFICIENT_RESOURCES", "NVML_ERROR_INSUFFICIENT_RESOURCES",
/// "insufficient-resources" or a number ("23"). SUCCESS is refused.
pub fn parse(s: &str) -> Option<Ret> {
    let t = s.trim();
    if let Ok(n) = t.parse::<u32>() {
        return (n != SUCCESS).then_some(Ret(n));
    }
    let up = t.to_ascii_uppercase().replace('-', "_");
    let up = up.strip_prefix("NVML_ERROR_").unwrap_or(&up);
    ALL.iter()
        .find(|(_, n, _)| *n == up)
        .map(|(c, _, _)| Ret(*c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_and_numbers() {
        assert_eq!(
            parse("INSUFFICIENT_RESOURCES"),
            Some(Ret::INSUFFICIENT_RESOURCES)
        );
        assert_eq!(parse("nvml_error_in_use"), Some(Ret::IN_USE));
        assert_eq!(parse("gpu-is-lost"), Some(Ret::GPU_IS_LOST));
        assert_eq!(parse("999"), Some(Ret::UNKNOWN));
        assert_eq!(parse("0"), None);
        assert_eq!(parse("bogus"), None);
        assert_eq!(message(23), "Insufficient resources\0");
    }
}
