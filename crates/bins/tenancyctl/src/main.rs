//! `tenancyctl`: the admin's view of slurm-tenancy.

mod admin;
mod adopt;
mod chain;
mod check;
mod containment;
mod devices;
mod doctor;
mod firewall;
mod forward;
mod keys;
mod metrics;
mod mig;
mod output;
mod prune;
mod reconcile;
mod report;
mod rotate;
mod scheduler;
mod scratch;
mod slurm_sync;
mod storage_audit;
mod verify;

use crate::output::Format;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_config::{group_gid, Config};

#[derive(Parser)]
#[command(
    name = "tenancyctl",
    version,
    about = "Administer slurm-tenancy: config, node, audit"
)]
struct Cli {
    /// Config file (default: TENANCY_CONFIG, tenancy.toml next to SLURM_CONF, /etc/slurm/tenancy.toml)
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config and summarise what each tenant and tier enforces (exit 0 or 1)
    Check {
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// slurm.conf whose nodes the node pools must name (default: SLURM_CONF, else
        /// /etc/slurm/slurm.conf)
        #[arg(long)]
        slurm_conf: Option<PathBuf>,
    },
    /// Check that this node can isolate every job (exit 1 on any error)
    Doctor(doctor::DoctorArgs),
    /// Accounting report over one or many audit logs; priced statements (--statement);
    /// the cross-check with Slurm's accounting (--compare-sacct, exit 1 on a disagreement)
    Report(report::ReportCmd),
    /// Tear down journals of jobs Slurm no longer runs and find product resources no journal
    /// owns (dry run unless --apply; exit 1 when something is left)
    Reconcile(reconcile::ReconcileArgs),
    /// Audit log integrity
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Per-tenant firewall (nftables)
    Firewall {
        #[command(subcommand)]
        command: FirewallCommand,
    },
    /// MIG instances and the node's MIG plan as slurm.conf/gres.conf lines
    Mig(mig::MigArgs),
    /// Device programs attached to a job's cgroup
    Devices(devices::DevicesArgs),
    /// Retained encrypted scratch: unlock (its key added again) or lock a job's folder
    Scratch(scratch::ScratchArgs),
    /// Report files and folders another tenant could read, write or enter (exit 1 if any)
    StorageAudit(storage_audit::AuditArgs),
    /// This node's jobs, MIG slices, firewall drops, refusals, rollbacks, job path durations
    /// and audit chain head as OpenMetrics text (node_exporter's textfile collector)
    Metrics(metrics::MetricsArgs),
    /// Slurm's side of the tenants: their accounts, users and quotas in slurmdbd
    Slurm {
        #[command(subcommand)]
        command: SlurmCommand,
    },
    /// Move an ssh session pam_slurm_adopt put into a job into the job's isolation, or refuse
    /// it (for pam_exec in the session phase; exit 1 refuses; under pam_exec a config found
    /// through the environment must be root's alone)
    Adopt(adopt::AdoptArgs),
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check every node's hash chain; report the first bad record with its line
    Verify(verify::VerifyArgs),
    /// Set this node's audit log aside under a dated name and go on with its chain in a new
    /// file (use this, not logrotate's create or copytruncate, which restart the chain)
    Rotate(rotate::RotateArgs),
    /// Make this node's Ed25519 key that signs its anchors, or rotate it; prints the line for
    /// the nodes' public keys file
    Keygen(keys::KeygenArgs),
    /// Ship every record and anchor of this node's audit log to the [audit] collectors as
    /// RFC 5424 over TLS (RFC 5425), resuming from its cursor (the tenancy-audit-forward unit)
    Forward(forward::ForwardArgs),
    /// Remove rotated audit files older than [audit] retain_days (or their tiers') and
    /// already forwarded; say what is kept and why (the log itself is never removed)
    Prune(prune::PruneArgs),
}

#[derive(Subcommand)]
enum SlurmCommand {
    /// Show (or with --apply make) each tenant's account, its GrpTRES/GrpJobs limits and its
    /// users in slurmdbd, through sacctmgr; idempotent, removes only what it made
    Sync(slurm_sync::SyncArgs),
}

#[derive(Subcommand)]
enum FirewallCommand {
    /// Print the tenants' rules summary (or the nft script with --rules) the config yields
    Show(firewall::ShowArgs),
    /// Create the tenant cgroups and load the product's nft table atomically
    Apply(firewall::ApplyArgs),
}

fn load(path: Option<&std::path::Path>) -> anyhow::Result<Config> {
    Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The config of `adopt`, found as every command finds it. Under pam_exec the environment is
/// the PAM environment, which the session's user can write to (adopt.rs): a config found
/// through it is used only when root owns it and nobody else can write it, so a user cannot
/// point adopt at a config of their own (with its journals and audit log where they like).
fn load_for_adopt(explicit: Option<&std::path::Path>) -> anyhow::Result<Config> {
    use std::os::unix::fs::MetadataExt;
    let path = Config::find(explicit).map_err(|e| anyhow::anyhow!("{e}"))?;
    if explicit.is_none() && adopt::under_pam_exec() {
        let m = std::fs::metadata(&path)
            .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        if m.uid() != 0 || m.mode() & 0o022 != 0 {
            anyhow::bail!(
                "config {} is not root's alone (owner uid {}, mode {:04o}): under pam_exec the \
                 environment that named it is one the session's user can set; not used. Put \
                 --config PATH on the pam_exec line",
                path.display(),
                m.uid(),
                m.mode() & 0o7777
            );
        }
    }
    Config::from_file(&path).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Tenant -> gids of its groups, for storage-audit.
/// Who belongs to which tenant, for storage-audit: each tenant's groups, and its members'
/// uids, so a file a user of another tenant owns, or a `user:` ACL entry naming one, is seen
/// for what it gives. A user in several tenants is mapped to none (the audit asks what one
/// tenant's members get that the other's do not), and root to none (it gets everything).
fn tenant_map(config: &Config) -> tenancy_storage_audit::TenantMap {
    let members = config.member_uids();
    let mut tenants_of = std::collections::HashMap::<u32, usize>::new();
    for uids in members.values() {
        for &u in uids {
            *tenants_of.entry(u).or_default() += 1;
        }
    }
    let mut map = tenancy_storage_audit::TenantMap::new();
    for t in config.tenants.values() {
        let gids: Vec<u32> = t.groups.iter().filter_map(|g| group_gid(g)).collect();
        let uids = members[&t.name]
            .iter()
            .copied()
            .filter(|u| *u != 0 && tenants_of[u] == 1);
        map.insert(t.name.clone(), gids, uids);
    }
    let encrypted = config.tenants.values().filter(|t| {
        config.tier_of(t).scratch_encryption == tenancy_config::ScratchEncryption::Required
    });
    map.require_encrypted_scratch(
        &config.cluster.scratch_root,
        encrypted.map(|t| t.name.clone()),
    );
    map
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = cli.config.as_deref();
    match cli.command {
        Command::Check { format, slurm_conf } => match check::load(config, slurm_conf) {
            Ok(config) => check::run(&config, format),
            Err(e) => {
                eprintln!("{e}");
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Doctor(args) => doctor::run(&load(config)?, &args),
        Command::Reconcile(args) => {
            let c = load(config)?;
            if args.apply {
                let r = reconcile::run(&c, args);
                admin::audited(&c, r)
            } else {
                reconcile::run(&c, args)
            }
        }
        Command::Report(cmd) => report::run(config, cmd),
        Command::Audit { command } => run_audit(config, command),
        Command::Firewall { command } => {
            let config = load(config)?;
            let spec = tenancy_node::layers::network::firewall_spec(&config)
                .map_err(|e| anyhow::anyhow!("firewall: {}", e.0))?;
            match command {
                FirewallCommand::Show(args) => firewall::run_show(&spec, &args),
                FirewallCommand::Apply(args) if args.dry_run => {
                    firewall::run_apply(&spec, &config.cluster.state_dir, &args)
                }
                FirewallCommand::Apply(args) => {
                    let r = firewall::run_apply(&spec, &config.cluster.state_dir, &args);
                    admin::audited(&config, r)
                }
            }
        }
        Command::Mig(mut args) => {
            if let Ok(c) = load(config) {
                if args.nvml_library.is_none() {
                    args.nvml_library = c.cluster.nvml_library.clone();
                    if let Some(f) = &c.cluster.nvml_shim_fixture {
                        std::env::set_var("NVML_SHIM_FIXTURE", f);
                    }
                }
                if !c.mig_plan.is_empty() {
                    args.config_plan = Some(tenancy_mig::NodePlan {
                        models: c.mig_plan.clone(),
                        gpus: Default::default(),
                    });
                }
            }
            mig::run(args)
        }
        Command::Devices(args) => devices::run(args),
        Command::StorageAudit(args) => {
            storage_audit::run_storage_audit(&args, &tenant_map(&load(config)?))
        }
        Command::Metrics(args) => metrics::run(&load(config)?, &args),
        Command::Scratch(args) => scratch::run(&load(config)?, &args),
        Command::Slurm {
            command: SlurmCommand::Sync(args),
        } => slurm_sync::run(&load(config)?, &args),
        Command::Adopt(args) => adopt::run(&load_for_adopt(config)?, &args),
    }
}

/// The `audit` commands: the chain's verification, rotation, keys, forwarding and pruning.
fn run_audit(config: Option<&std::path::Path>, command: AuditCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::Verify(mut args) => {
            // With anchors to check, the config's key and public keys authenticate them unless
            // named.
            if !args.anchors.is_empty() && (args.anchor_key.is_none() || args.public_keys.is_none())
            {
                if let Ok(c) = load(config) {
                    if args.anchor_key.is_none() {
                        args.anchor_key = c.cluster.audit_anchor_key;
                    }
                    if args.public_keys.is_none() {
                        args.public_keys = c.audit.public_keys;
                    }
                }
            }
            verify::run_verify(args)
        }
        AuditCommand::Rotate(args) => match load(config) {
            Ok(c) if args.log.is_none() => {
                let r = rotate::run(Ok(c.clone()), &args);
                admin::audited(&c, r)
            }
            c => rotate::run(c, &args),
        },
        AuditCommand::Keygen(args) => {
            let c = load(config)?;
            if args.if_missing && c.audit.signing_key.exists() {
                return keys::run(&c, &args);
            }
            let r = keys::run(&c, &args);
            admin::audited(&c, r)
        }
        AuditCommand::Forward(args) => forward::run(&load(config)?, &args),
        AuditCommand::Prune(args) => {
            let c = load(config)?;
            if args.dry_run {
                prune::run(&c, &args)
            } else {
                let r = prune::run(&c, &args);
                admin::audited(&c, r)
            }
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tenancyctl: {e:#}");
            ExitCode::from(2)
        }
    }
}
