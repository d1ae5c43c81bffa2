//! `tenancyctl metrics`: this node's state as OpenMetrics text, for node_exporter's textfile
//! collector (`--textfile DIR` renames `slurm_tenancy.prom` into place whole) or a scrape.
//!
//! Every series is named `slurm_tenancy_*` and labelled only by what the config bounds
//! (tenant, tier, GPU index, MIG profile, prolog or epilog): never a job id or a user, which
//! would make a new series per job. Sources: the journals (running jobs, MIG slices, what
//! reconcile must finish), the product's nft counters (drops), this node's audit log (refusals,
//! rollbacks, teardown failures, job path durations, chain head, last reconcile). Counters
//! taken from the audit log count what its current file holds: `audit rotate` starts them
//! again from the new file's records, which Prometheus' `rate` reads as a counter reset.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tenancy_audit_log::{Event, Record};
use tenancy_config::Config;
use tenancy_job::{JournalDir, StepState};

#[derive(clap::Args)]
pub struct MetricsArgs {
    /// Write DIR/slurm_tenancy.prom (node_exporter's --collector.textfile.directory) through a
    /// temporary file renamed over it, instead of printing
    #[arg(long, value_name = "DIR")]
    pub textfile: Option<PathBuf>,
}

/// The file the textfile collector reads.
pub const TEXTFILE: &str = "slurm_tenancy.prom";

/// Upper bounds of the job path histogram, in seconds: the prolog and epilog take a few
/// milliseconds (BENCHMARKS.md); a MIG job's NVML calls, hundreds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

pub fn run(config: &Config, args: &MetricsArgs) -> anyhow::Result<ExitCode> {
    let text = render(config)?;
    match &args.textfile {
        None => print!("{text}"),
        Some(dir) => write_textfile(dir, &text)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Replaces `dir/slurm_tenancy.prom` whole: the collector never reads a half-written file.
fn write_textfile(dir: &Path, text: &str) -> anyhow::Result<()> {
    let path = dir.join(TEXTFILE);
    let tmp = dir.join(format!(".{TEXTFILE}.{}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_data()?;
        // The collector (node_exporter's user) reads it.
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        anyhow::bail!(
            "metrics: cannot write {}: {e}; the folder must exist and be writable by root \
             (node_exporter's --collector.textfile.directory)",
            path.display()
        );
    }
    Ok(())
}

/// One sample: (name suffix, labels, value).
type Sample = (&'static str, Vec<(&'static str, String)>, String);

/// One metric family and its samples.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<Sample>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        }
    }
    fn add(&mut self, labels: Vec<(&'static str, String)>, value: impl ToString) {
        let suffix = if self.kind == "counter" { "_total" } else { "" };
        self.samples.push((suffix, labels, value.to_string()));
    }
    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        for (suffix, labels, value) in &self.samples {
            let _ = write!(out, "{}{suffix}", self.name);
            if !labels.is_empty() {
                let l: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                let _ = write!(out, "{{{}}}", l.join(","));
            }
            let _ = writeln!(out, " {value}");
        }
    }
}

/// Label values are config names (already `[a-z0-9_-]`) or MIG profiles; escape anyway.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The file in `state_dir` whose modification time is the last `reconcile --apply` that left
/// nothing: metrics' `slurm_tenancy_last_reconcile_timestamp_seconds`.
pub const RECONCILED: &str = "reconciled";

/// Records a successful `reconcile --apply` (best effort: only a metric reads it).
pub fn mark_reconciled(state_dir: &Path) {
    let path = state_dir.join(RECONCILED);
    if let Err(e) = std::fs::write(&path, b"") {
        eprintln!(
            "tenancyctl reconcile: cannot record the time in {}: {e} (metrics only)",
            path.display()
        );
    }
}

/// What the current audit log file says.
#[derive(Default)]
struct FromAudit {
    refused: u64,
    rollbacks: u64,
    teardown_failures: u64,
    starts: u64,
    ends: u64,
    head_seq: u64,
    /// Every record's seq and time (the forwarding lag's age of the oldest unforwarded one).
    times: Vec<(u64, chrono::DateTime<chrono::Utc>)>,
    /// "prolog" / "epilog" -> durations in seconds.
    durations: BTreeMap<&'static str, Vec<f64>>,
}

fn read_audit(path: &Path) -> anyhow::Result<FromAudit> {
    let mut a = FromAudit::default();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(a),
        Err(e) => anyhow::bail!(
            "metrics: cannot read the audit log {} (cluster.audit_log): {e}",
            path.display()
        ),
    };
    for (n, line) in text.lines().enumerate() {
        // A torn last line (an append in progress) is skipped, as verify reports it.
        let Ok(r) = serde_json::from_str::<Record>(line) else {
            if n + 1 < text.lines().count() {
                eprintln!(
                    "tenancyctl metrics: {}:{}: not an audit record, skipped; run \
                     `tenancyctl audit verify {}`",
                    path.display(),
                    n + 1,
                    path.display()
                );
            }
            continue;
        };
        a.head_seq = a.head_seq.max(r.seq);
        a.times.push((r.seq, r.time));
        let secs = r.duration_us.map(|us| us as f64 / 1e6);
        match r.event {
            Event::JobDenied => a.refused += 1,
            Event::Rollback => a.rollbacks += 1,
            Event::TeardownFailed => a.teardown_failures += 1,
            Event::JobStart => {
                a.starts += 1;
                if let Some(s) = secs {
                    a.durations.entry("prolog").or_default().push(s);
                }
            }
            Event::JobEnd => {
                a.ends += 1;
                if let Some(s) = secs {
                    a.durations.entry("epilog").or_default().push(s);
                }
            }
            _ => {}
        }
    }
    Ok(a)
}

/// What the journals say: running jobs per (tenant, tier), MIG slices per (GPU, profile),
/// and the journals reconcile must finish.
struct FromJournals {
    running: BTreeMap<(String, String), u64>,
    slices: BTreeMap<(String, String), u64>,
    left: u64,
}

fn read_journals(config: &Config) -> anyhow::Result<FromJournals> {
    let journals = JournalDir::at(&config.cluster.state_dir);
    let ids = match journals.job_ids() {
        Ok(ids) => ids,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => anyhow::bail!(
            "metrics: cannot list the journals in {} (cluster.state_dir): {e}",
            config.cluster.state_dir.display()
        ),
    };
    let mut running: BTreeMap<(String, String), u64> = BTreeMap::new();
    for t in config.tenants.values() {
        running.insert((t.name.clone(), t.tier.clone()), 0);
    }
    let mut slices: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut left = 0u64;
    for id in ids {
        let journal = match journals.load_unlocked(id) {
            Ok(Some(j)) => j,
            // Ended meanwhile.
            Ok(None) => continue,
            Err(_) => {
                left += 1;
                continue;
            }
        };
        let torn = journal.steps.iter().any(|s| s.state == StepState::Undone);
        if torn || journal.from_earlier_boot() {
            left += 1;
            continue;
        }
        // A tenant no longer in the config keeps its series until its jobs end (bounded by
        // the tenants ever configured).
        *running
            .entry((journal.tenant.clone(), journal.tier.clone()))
            .or_default() += 1;
        if let Some(m) = tenancy_node::layers::mig::Made::in_journal(&journal) {
            let (gpu, profile) = match m {
                Ok(m) if !m.profile.is_empty() => (m.slice.gpu_index.to_string(), m.profile),
                Ok(m) => (m.slice.gpu_index.to_string(), "unknown".to_string()),
                Err(_) => (String::new(), "unknown".to_string()),
            };
            *slices.entry((gpu, profile)).or_default() += 1;
        }
    }
    // Intents of an earlier boot whose journal a power loss took: reconcile restores them.
    if let Ok((lost, unreadable)) = journals.recover_intents(false) {
        left += (lost.len() + unreadable.len()) as u64;
    }
    Ok(FromJournals {
        running,
        slices,
        left,
    })
}

/// The whole exposition, `# EOF` included.
pub fn render(config: &Config) -> anyhow::Result<String> {
    let journals = read_journals(config)?;
    let audit = read_audit(&config.cluster.audit_log)?;
    let mut families = journal_families(&journals);
    families.extend(firewall_families(config));
    families.push(job_path_histogram(&audit));
    families.extend(audit_counters(&audit));
    families.extend(node_families(config, &journals, &audit));
    families.extend(forward_families(config, &audit));

    let mut out = String::new();
    for f in &families {
        f.write(&mut out);
    }
    out.push_str("# EOF\n");
    Ok(out)
}

/// Running jobs and the MIG slices they hold.
fn journal_families(journals: &FromJournals) -> Vec<Family> {
    let mut running = Family::new(
        "slurm_tenancy_jobs_running",
        "gauge",
        "Jobs isolated on this node now, per tenant and tier (from the journals).",
    );
    for ((tenant, tier), n) in &journals.running {
        running.add(vec![("tenant", tenant.clone()), ("tier", tier.clone())], n);
    }
    let mut slices = Family::new(
        "slurm_tenancy_mig_slices_in_use",
        "gauge",
        "MIG GPU instances jobs hold, per GPU index and profile.",
    );
    for ((gpu, profile), n) in &journals.slices {
        slices.add(vec![("gpu", gpu.clone()), ("profile", profile.clone())], n);
    }
    vec![running, slices]
}

/// Whether the firewall is loaded, and its drop counters per tenant (none when it is not).
fn firewall_families(config: &Config) -> Vec<Family> {
    let counters = tenancy_node::layers::network::firewall_spec(config)
        .ok()
        .and_then(|spec| tenancy_network::counters(&spec).ok());
    let mut loaded = Family::new(
        "slurm_tenancy_firewall_loaded",
        "gauge",
        "1 when the product's nft table is loaded (tenancyctl firewall apply), else 0.",
    );
    loaded.add(vec![], u8::from(counters.is_some()));
    let mut packets = Family::new(
        "slurm_tenancy_firewall_dropped_packets",
        "counter",
        "Packets the firewall dropped from the tenant's jobs since the table was loaded.",
    );
    let mut bytes = Family::new(
        "slurm_tenancy_firewall_dropped_bytes",
        "counter",
        "Bytes the firewall dropped from the tenant's jobs since the table was loaded.",
    );
    for c in counters.iter().flatten() {
        packets.add(vec![("tenant", c.tenant.clone())], c.packets);
        bytes.add(vec![("tenant", c.tenant.clone())], c.bytes);
    }
    vec![loaded, packets, bytes]
}

/// The prolog's and the epilog's durations, from the audit log's job_start and job_end.
fn job_path_histogram(audit: &FromAudit) -> Family {
    let mut h = Family::new(
        "slurm_tenancy_job_path_seconds",
        "histogram",
        "Time the prolog took to a job's job_start record and the epilog to its job_end.",
    );
    for path in ["prolog", "epilog"] {
        let d = audit.durations.get(path).map(Vec::as_slice).unwrap_or(&[]);
        for le in BUCKETS {
            let n = d.iter().filter(|&&s| s <= le).count();
            h.samples.push((
                "_bucket",
                vec![("path", path.to_string()), ("le", format!("{le}"))],
                n.to_string(),
            ));
        }
        h.samples.push((
            "_bucket",
            vec![("path", path.to_string()), ("le", "+Inf".to_string())],
            d.len().to_string(),
        ));
        h.samples.push((
            "_count",
            vec![("path", path.to_string())],
            d.len().to_string(),
        ));
        h.samples.push((
            "_sum",
            vec![("path", path.to_string())],
            format!("{}", d.iter().sum::<f64>()),
        ));
    }
    h
}

/// The audit log's records of each kind that counts.
fn audit_counters(audit: &FromAudit) -> Vec<Family> {
    [
        (
            "slurm_tenancy_job_starts",
            "job_start records in the current audit log file.",
            audit.starts,
        ),
        (
            "slurm_tenancy_job_ends",
            "job_end records in the current audit log file.",
            audit.ends,
        ),
        (
            "slurm_tenancy_jobs_refused",
            "job_denied records (jobs the prolog refused) in the current audit log file.",
            audit.refused,
        ),
        (
            "slurm_tenancy_rollbacks",
            "rollback records (a layer failed at job start) in the current audit log file.",
            audit.rollbacks,
        ),
        (
            "slurm_tenancy_teardown_failures",
            "teardown_failed records (the node kept something of a job) in the current audit \
             log file.",
            audit.teardown_failures,
        ),
    ]
    .into_iter()
    .map(|(name, help, n)| {
        let mut f = Family::new(name, "counter", help);
        f.add(vec![], n);
        f
    })
    .collect()
}

/// What reconcile has left to do and last did, and the head of the audit chain.
fn node_families(config: &Config, journals: &FromJournals, audit: &FromAudit) -> Vec<Family> {
    let mut left = Family::new(
        "slurm_tenancy_journals_left_for_reconcile",
        "gauge",
        "Journals tenancyctl reconcile --apply must finish: partly torn down, of an earlier \
         boot, unreadable, or only in the intent log.",
    );
    left.add(vec![], journals.left);
    let mut head = Family::new(
        "slurm_tenancy_audit_chain_head_seq",
        "gauge",
        "Sequence number of the last record of this node's audit chain.",
    );
    head.add(vec![], audit.head_seq);
    let mut last = Family::new(
        "slurm_tenancy_last_reconcile_timestamp_seconds",
        "gauge",
        "Time of the last tenancyctl reconcile --apply that left nothing (0: none yet).",
    );
    let reconciled = std::fs::metadata(config.cluster.state_dir.join(RECONCILED))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_millis() as f64 / 1e3);
    last.add(vec![], reconciled);
    vec![left, head, last]
}

/// The forwarder's state per collector, from its cursor (`tenancyctl audit forward`): what
/// the collector has not confirmed, in records and in the age of the oldest of them, the last
/// seq it confirmed, and the errors so far.
fn forward_families(config: &Config, audit: &FromAudit) -> Vec<Family> {
    let mut lag = Family::new(
        "slurm_tenancy_audit_forward_lag_records",
        "gauge",
        "Records of this node's chain the collector has not confirmed yet.",
    );
    let mut lag_s = Family::new(
        "slurm_tenancy_audit_forward_lag_seconds",
        "gauge",
        "Age of the oldest record the collector has not confirmed (0: none).",
    );
    let mut last = Family::new(
        "slurm_tenancy_audit_forward_last_seq",
        "gauge",
        "Sequence number of the last record the collector confirmed.",
    );
    let mut errors = Family::new(
        "slurm_tenancy_audit_forward_errors",
        "counter",
        "Failed connections and sends to the collector (the cursor file's count).",
    );
    let mut up = Family::new(
        "slurm_tenancy_audit_forward_connected",
        "gauge",
        "1 while the forwarder holds a TLS session with the collector.",
    );
    let now = chrono::Utc::now();
    for c in &config.audit.collectors {
        let name = c.to_string();
        let cursor = crate::forward::read_cursor(&crate::forward::cursor_path(config, c))
            .ok()
            .flatten()
            .unwrap_or_default();
        let behind = audit.head_seq.saturating_sub(cursor.record.seq);
        let oldest = audit
            .times
            .iter()
            .find(|(s, _)| *s > cursor.record.seq)
            .map(|(_, t)| *t)
            .or_else(|| audit.times.first().map(|(_, t)| *t));
        let age = if behind == 0 {
            0.0
        } else {
            oldest.map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1e3)
        };
        lag.add(vec![("collector", name.clone())], behind);
        lag_s.add(vec![("collector", name.clone())], age);
        last.add(vec![("collector", name.clone())], cursor.record.seq);
        errors.add(vec![("collector", name.clone())], cursor.errors);
        up.add(vec![("collector", name)], u8::from(cursor.connected));
    }
    vec![lag, lag_s, last, errors, up]
}
