//! `tenancyctl check`: validates the config and prints what each tenant and tier enforces.

use crate::output::Rows;
use serde::Serialize;
use std::process::ExitCode;
use tenancy_config::{group_gid, Config, ScratchOnExit};
use tenancy_output::Format;

#[derive(Serialize)]
struct TenantRow {
    tenant: String,
    tier: String,
    groups: Vec<String>,
    accounts: Vec<String>,
    egress: Vec<String>,
    mig_profiles: Vec<String>,
    share_gpu: bool,
    share_node: bool,
    scratch_on_exit: String,
    /// Groups this host's NSS does not know (members cannot be resolved here).
    unknown_groups: Vec<String>,
}

fn scratch_policy(on_exit: ScratchOnExit, days: u32) -> String {
    match on_exit {
        ScratchOnExit::Wipe => "wipe".into(),
        ScratchOnExit::Retain => format!("retain {days} days"),
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

/// The config, its node pools checked against slurm.conf's nodes when slurm.conf can be read
/// (a warning says so when it cannot and there are pools).
pub fn load(
    explicit: Option<&std::path::Path>,
    slurm_conf: Option<std::path::PathBuf>,
) -> Result<Config, tenancy_config::ConfigError> {
    let path = Config::find(explicit)?;
    let slurm_path = slurm_conf.unwrap_or_else(tenancy_config::slurm_conf::default_path);
    match tenancy_config::slurm_conf::SlurmConf::load(&slurm_path) {
        Ok(slurm) => Config::from_file_for(&path, Some(&slurm)),
        Err(e) => {
            let config = Config::from_file(&path)?;
            if config.has_pools() {
                eprintln!("warning: node pools not checked against slurm.conf's nodes: {e}");
            }
            Ok(config)
        }
    }
}

pub fn run(config: &Config, format: Format) -> anyhow::Result<ExitCode> {
    let rows: Vec<TenantRow> = config
        .tenants
        .values()
        .map(|t| {
            let tier = config.tier_of(t);
            TenantRow {
                tenant: t.name.clone(),
                tier: tier.name.clone(),
                groups: t.groups.clone(),
                accounts: t.accounts.clone(),
                egress: t.egress.iter().map(ToString::to_string).collect(),
                mig_profiles: tier.mig_profiles.clone(),
                share_gpu: tier.share_gpu,
                share_node: tier.share_node,
                scratch_on_exit: match tier.scratch_encryption {
                    tenancy_config::ScratchEncryption::Off => {
                        scratch_policy(tier.scratch_on_exit, tier.retain_days)
                    }
                    tenancy_config::ScratchEncryption::Required => format!(
                        "{}, encrypted",
                        scratch_policy(tier.scratch_on_exit, tier.retain_days)
                    ),
                },
                unknown_groups: t
                    .groups
                    .iter()
                    .filter(|g| group_gid(g).is_none())
                    .cloned()
                    .collect(),
            }
        })
        .collect();
    if format == Format::Table {
        let c = &config.cluster;
        println!(
            "config {}: OK: cluster {}, {} tier(s), {} tenant(s)",
            config.path.display(),
            c.name,
            config.tiers.len(),
            config.tenants.len()
        );
        println!(
            "state_dir {}  audit_log {}  scratch_root {}",
            c.state_dir.display(),
            c.audit_log.display(),
            c.scratch_root.display()
        );
        let infra: Vec<String> = config
            .infrastructure
            .iter()
            .map(ToString::to_string)
            .collect();
        println!(
            "infrastructure (every tenant): {}\n",
            if infra.is_empty() {
                "none".into()
            } else {
                infra.join(", ")
            }
        );
    }
    Rows {
        headers: &[
            "tenant",
            "tier",
            "groups",
            "accounts",
            "mig profiles",
            "share gpu",
            "share node",
            "scratch on exit",
            "egress",
        ],
        rows: &rows,
        cells: |r| {
            vec![
                r.tenant.clone(),
                r.tier.clone(),
                r.groups.join(","),
                r.accounts.join(","),
                r.mig_profiles.join(","),
                yes_no(r.share_gpu),
                yes_no(r.share_node),
                r.scratch_on_exit.clone(),
                r.egress.join(","),
            ]
        },
    }
    .print(format)?;
    if format == Format::Table {
        for r in rows.iter().filter(|r| !r.unknown_groups.is_empty()) {
            eprintln!(
                "warning: tenant {}: group(s) {} unknown to NSS on this host",
                r.tenant,
                r.unknown_groups.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
