//! The systemd units the package installs (packaging/systemd), as tests run them: a unit's
//! `ExecStart` with the installed tenancyctl replaced by the one built here.

use std::path::{Path, PathBuf};

/// packaging/systemd in this checkout.
pub fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../packaging/systemd")
}

/// The words of `unit`'s `ExecStart`, its program (which must be the installed tenancyctl)
/// replaced by `tenancyctl`; an error names the unit and what is wrong with it.
pub fn unit_exec_start(unit: &str, tenancyctl: &Path) -> Result<Vec<String>, String> {
    let file = units_dir().join(unit);
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart="))
        .ok_or_else(|| format!("{}: no ExecStart", file.display()))?;
    let mut words: Vec<String> = line.split_whitespace().map(String::from).collect();
    match words.first().map(String::as_str) {
        Some("/usr/bin/tenancyctl") => {
            words[0] = tenancyctl.display().to_string();
            Ok(words)
        }
        other => Err(format!(
            "{}: runs {}, not /usr/bin/tenancyctl",
            file.display(),
            other.unwrap_or("nothing")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconcile_service_runs_tenancyctl_reconcile_apply() {
        let w =
            unit_exec_start("tenancy-reconcile.service", Path::new("/built/tenancyctl")).unwrap();
        assert_eq!(w[0], "/built/tenancyctl");
        assert!(w.iter().any(|x| x == "reconcile"), "{w:?}");
        assert!(w.iter().any(|x| x == "--apply"), "{w:?}");
    }

    #[test]
    fn a_unit_without_exec_start_is_an_error_that_names_it() {
        let e = unit_exec_start("tenancy-reconcile.timer", Path::new("/t")).unwrap_err();
        assert!(
            e.contains("tenancy-reconcile.timer") && e.contains("no ExecStart"),
            "{e}"
        );
    }
}
