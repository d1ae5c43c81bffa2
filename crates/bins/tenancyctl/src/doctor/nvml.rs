//! NVML: the library, each GPU's MIG mode, the configured profiles against the driver's.

use super::{row, Row};
use tenancy_config::Config;
use tenancy_devices::doctor::Severity;

/// NVML and each GPU's MIG mode, and the configured profile names against the driver's.
pub(super) fn nvml_rows(config: &Config, rows: &mut Vec<Row>) {
    if let Some(f) = &config.cluster.nvml_shim_fixture {
        // Only the NVML stand-in reads it (tests and demos).
        std::env::set_var("NVML_SHIM_FIXTURE", f);
    }
    let opened = tenancy_mig::Mig::open(config.cluster.nvml_library.as_deref());
    if opened.is_ok() && !crate::check::configured_mig_names(config).is_empty() {
        match crate::check::mig_name_report(config) {
            Ok((driver, bad)) if bad.is_empty() => rows.push(row(
                "nvml.profiles",
                Severity::Ok,
                format!("the configured MIG profile names are the driver {driver}'s"),
                None,
            )),
            Ok((_, bad)) => {
                for m in bad {
                    rows.push(row(
                        "nvml.profiles",
                        Severity::Warn,
                        m,
                        Some(
                            "keep the product's names in tenancy.toml (the slices are made by \
                             profile id); in gres.conf use `tenancyctl mig slurm-lines`, not \
                             AutoDetect=nvml"
                                .into(),
                        ),
                    ));
                }
            }
            Err(e) => rows.push(row("nvml.profiles", Severity::Warn, e, None)),
        }
    }
    match opened {
        Ok(mig) => match mig.gpus() {
            Ok(gpus) => {
                for g in gpus {
                    let (sev, remedy) = if let Some(why) = &g.unusable {
                        rows.push(row("nvml.gpu", Severity::Warn, why.clone(), None));
                        continue;
                    } else if g.mig_enabled && g.model.is_some() {
                        (Severity::Ok, None)
                    } else {
                        (
                            Severity::Warn,
                            Some(
                                "enable MIG (nvidia-smi -i N -mig 1) on GPUs meant for slices"
                                    .into(),
                            ),
                        )
                    };
                    rows.push(row(
                        "nvml.gpu",
                        sev,
                        format!(
                            "GPU {} {} {}: MIG {}",
                            g.index,
                            g.name,
                            g.uuid,
                            if g.mig_enabled { "on" } else { "off" }
                        ),
                        remedy,
                    ));
                }
            }
            Err(e) => rows.push(row("nvml.gpu", Severity::Error, e.to_string(), None)),
        },
        Err(e) => rows.push(row(
            "nvml.load",
            Severity::Warn,
            format!("{e} (jobs asking for --mig will be refused)"),
            Some("set cluster.nvml_library or install the NVIDIA driver".into()),
        )),
    }
}
