//! `tenancyctl report --statement` priced by `[billing]`, in table, CSV, JSON and HTML (the HTML
//! loaded by a real headless Chromium), its integrity line from `audit verify`, and
//! `report --compare-sacct` against a file of `sacct` output.

mod common;

use common::{printed as text, tenancyctl};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use tenancy_audit_log::{send_anchor_to, AuditLog, Event, Outcome, Record};
use tenancy_test_support::TenancyToml;

fn t(d: u32, h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, d, h, m, 0).unwrap()
}

const BILLING: &str = "[billing]\ncurrency = \"EUR\"\njob_hour_without_mig = 0.10\n\
                       [billing.rates]\n\"1g.18gb\" = 0.85\n\"3g.71gb\" = \"2.40\"\n";

/// A config with two tenants (tier `gpu` offers 1g.18gb and 3g.71gb) and `billing`.
fn config(root: &Path, billing: &str) -> PathBuf {
    let c = root.join("tenancy.toml");
    let mut text = TenancyToml::under("t", root);
    text.cluster().audit_log(root.join("logs/audit.jsonl"));
    text.tier("gpu").mig_profiles(["1g.18gb", "3g.71gb"]);
    text.tenant("acme").tier("gpu").groups(["root"]);
    text.tenant("globex").tier("gpu").groups(["daemon"]);
    // The billing under test, as written (some of it on purpose not a valid config).
    std::fs::write(&c, format!("{text}{billing}")).unwrap();
    c
}

/// Each node's log (`logs/<node>.jsonl`, as collected off the nodes) and the anchor file.
struct Log {
    root: PathBuf,
    logs: std::collections::BTreeMap<String, AuditLog>,
    anchors: PathBuf,
}

impl Log {
    fn new(root: &Path) -> Log {
        std::fs::create_dir_all(root.join("logs")).unwrap();
        Log {
            root: root.to_path_buf(),
            logs: Default::default(),
            anchors: root.join("anchors"),
        }
    }

    fn rec(&mut self, node: &str, ev: Event, tenant: &str, id: u64, at: DateTime<Utc>) -> Record {
        let mut r = Record::new("t", node, "alice", 1001, ev, Outcome::Success, "test").job_id(id);
        r.time = at;
        r.tenant = Some(tenant.to_string());
        r
    }

    fn append(&mut self, mut r: Record) {
        let path = self.root.join(format!("logs/{}.jsonl", r.node));
        let log = self
            .logs
            .entry(r.node.clone())
            .or_insert_with(|| AuditLog::open(path).unwrap().with_fsync(false));
        let a = log.append(&mut r).unwrap();
        // Anchored as the epilog does, to the anchor file.
        send_anchor_to(
            Path::new("/nonexistent/log"),
            &r.node,
            a.seq,
            &a.hash,
            Some(&self.anchors),
            None,
        );
    }

    /// A job of `tenant` on `node` from `from` to `to` with a MIG `profile` (or none).
    fn job(
        &mut self,
        node: &str,
        tenant: &str,
        id: u64,
        profile: Option<&str>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) {
        let mut s = self.rec(node, Event::JobStart, tenant, id, from);
        s.profile = profile.map(str::to_string);
        s.compute_slices = profile.map(|_| 1);
        self.append(s);
        let mut e = self.rec(node, Event::JobEnd, tenant, id, to);
        e.profile = profile.map(str::to_string);
        e.started = Some(from);
        self.append(e);
    }

    /// A prolog's `job_start` with a MIG `profile` and no `job_end` after it.
    fn start(&mut self, tenant: &str, id: u64, profile: &str, at: DateTime<Utc>) {
        let mut s = self.rec("n1", Event::JobStart, tenant, id, at);
        s.profile = Some(profile.to_string());
        self.append(s);
    }

    /// The `job_end` an epilog writes for a run it finds no journal of.
    fn no_journal_end(&mut self, tenant: &str, id: u64, at: DateTime<Utc>) {
        let mut e = self.rec("n1", Event::JobEnd, tenant, id, at);
        e.reason = Some("no journal: the prolog made nothing for this job".into());
        self.append(e);
    }

    fn incident(&mut self, ev: Event, tenant: &str, id: u64, at: DateTime<Utc>, reason: &str) {
        let mut r = self.rec("n1", ev, tenant, id, at);
        r.outcome = Outcome::Failure;
        r.reason = Some(reason.to_string());
        self.append(r);
    }
}

/// January 2026: acme 1g.18gb 3.5 h + 1 h, 3g.71gb 2 h, 10 h without a slice, one refusal and
/// one rollback; globex 3g.71gb 1 h; and a February job that is not in January's statement.
fn january(root: &Path) -> Log {
    let mut l = Log::new(root);
    l.job("n1", "acme", 1, Some("1g.18gb"), t(5, 10, 0), t(5, 13, 30));
    l.job("n1", "acme", 2, Some("1g.18gb"), t(6, 0, 0), t(6, 1, 0));
    l.job("n2", "acme", 3, Some("3g.71gb"), t(6, 8, 0), t(6, 10, 0));
    l.job("n2", "acme", 4, None, t(7, 0, 0), t(7, 10, 0));
    l.job("n1", "globex", 5, Some("3g.71gb"), t(9, 12, 0), t(9, 13, 0));
    l.incident(
        Event::JobDenied,
        "acme",
        6,
        t(10, 9, 0),
        "user bob is not a member of tenant 'acme'",
    );
    l.incident(
        Event::Rollback,
        "acme",
        7,
        t(11, 9, 0),
        "layer mig: no free 1g.18gb placement",
    );
    let feb = Utc.with_ymd_and_hms(2026, 2, 2, 0, 0, 0).unwrap();
    l.job(
        "n1",
        "acme",
        8,
        Some("1g.18gb"),
        feb,
        feb + chrono::Duration::hours(5),
    );
    l
}

fn line<'a>(doc: &'a Value, tenant: &str, profile: Option<&str>) -> &'a Value {
    doc["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["tenant"] == tenant)
        .unwrap_or_else(|| panic!("no tenant {tenant} in {doc:#}"))["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["profile"].as_str() == profile)
        .unwrap_or_else(|| panic!("no line {profile:?} for {tenant} in {doc:#}"))
}

fn tenant<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["tenant"] == name)
        .unwrap()
}

#[test]
fn statement_amounts_follow_the_rates() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let c = config(root, BILLING);
    january(root);
    let logs = root.join("logs");
    let logs = logs.to_str().unwrap();

    let o = tenancyctl(
        &c,
        &["report", "--statement", "2026-01", "--format", "json", logs],
    );
    assert!(o.status.success(), "{}", text(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["currency"], "EUR");
    // 4.5 slice-hours × 0.85 = 3.825 -> 3.83 (the February job is not in January).
    let l = line(&doc, "acme", Some("1g.18gb"));
    assert_eq!(l["usage_ms"], 4 * 3_600_000 + 1_800_000);
    assert_eq!(l["quantity"], "4.5");
    assert_eq!(l["rate"], "0.85");
    assert_eq!(l["amount"], "3.83");
    assert_eq!(l["jobs"], 2);
    assert_eq!(line(&doc, "acme", Some("3g.71gb"))["amount"], "4.80");
    // Without a MIG slice: job-hours at the job-hour price, 10 × 0.10 = 1.00.
    let none = line(&doc, "acme", None);
    assert_eq!(none["unit"], "job-hours");
    assert_eq!(none["amount"], "1.00");
    assert_eq!(tenant(&doc, "acme")["total_amount"], "9.63");
    assert_eq!(tenant(&doc, "acme")["refusals"], 1);
    assert_eq!(tenant(&doc, "acme")["rollbacks"], 1);
    assert_eq!(tenant(&doc, "globex")["total_amount"], "2.40");
    assert_eq!(doc["total_amount"], "12.03");
    // Daily usage for the chart: job 1 on the 5th, 3.5 h in ms.
    assert_eq!(
        tenant(&doc, "acme")["daily_ms"]["2026-01-05"]["1g.18gb"],
        12_600_000
    );

    // One tenant's statement alone.
    let o = tenancyctl(
        &c,
        &[
            "report",
            "--statement",
            "2026-01",
            "--tenant",
            "globex",
            "--format",
            "json",
            logs,
        ],
    );
    let one: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(one["tenants"].as_array().unwrap().len(), 1, "{one:#}");
    assert_eq!(tenant(&one, "globex")["total_amount"], "2.40");

    // CSV carries the same figures.
    let o = tenancyctl(
        &c,
        &["report", "--statement", "2026-01", "--format", "csv", logs],
    );
    assert!(o.status.success(), "{}", text(&o));
    let csv = String::from_utf8_lossy(&o.stdout);
    assert!(
        csv.lines()
            .any(|l| l
                .starts_with("2026-01,acme,1g.18gb,slice-hours,2,16200000,4.5000,0.85,3.83,EUR")),
        "{csv}"
    );
    assert!(
        csv.lines()
            .any(|l| l.starts_with("2026-01,acme,TOTAL,,") && l.contains(",9.63,EUR,1,1,0,yes")),
        "{csv}"
    );
    // The table too.
    let o = tenancyctl(&c, &["report", "--statement", "2026-01", logs]);
    let table = text(&o);
    assert!(
        table.contains("EUR 9.63")
            && table.contains("EUR 0.85 / slice-hour")
            && table.contains("EUR 2.40 / slice-hour")
            && table.contains("All tenants, 2026-01: EUR 12.03"),
        "{table}"
    );

    // Other prices, other amounts: doubled 1g.18gb, and a decimal price that a binary float
    // would not hold (0.1 × 3 h of jobs without a slice, 0.3 exact).
    let c = config(
        root,
        "[billing]\ncurrency = \"USD\"\njob_hour_without_mig = \"0.1\"\n[billing.rates]\n\
         \"1g.18gb\" = 1.70\n\"3g.71gb\" = 2_000.005\n",
    );
    let o = tenancyctl(
        &c,
        &["report", "--statement", "2026-01", "--format", "json", logs],
    );
    assert!(o.status.success(), "{}", text(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["currency"], "USD");
    assert_eq!(line(&doc, "acme", Some("1g.18gb"))["amount"], "7.65");
    // 2 h × 2000.005 = 4000.01 exactly.
    assert_eq!(line(&doc, "acme", Some("3g.71gb"))["amount"], "4000.01");
    assert_eq!(tenant(&doc, "acme")["total_amount"], "4008.66");
}

#[test]
fn bad_rates_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let check = |billing: &str, want: &[&str]| {
        let c = config(root, billing);
        let o = tenancyctl(&c, &["check"]);
        let out = text(&o);
        assert!(!o.status.success(), "accepted:\n{billing}\n{out}");
        for w in want {
            assert!(out.contains(w), "wanted {w:?} for\n{billing}\ngot:\n{out}");
        }
        // It names the file and the line.
        assert!(out.contains("tenancy.toml:"), "{out}");
    };
    let base = |rates: &str, extra: &str| {
        format!("[billing]\ncurrency = \"EUR\"\njob_hour_without_mig = 0.1\n{extra}[billing.rates]\n{rates}")
    };
    // Each rate written wrong, and the words its error must hold.
    let bad_rates: [(&str, &[&str]); 6] = [
        (
            "\"1g.18gb\" = -0.85\n\"3g.71gb\" = 1\n",
            &["cannot be negative"],
        ),
        (
            "\"1g.18gb\" = \"cheap\"\n\"3g.71gb\" = 1\n",
            &["not a decimal price"],
        ),
        (
            "\"1g.18gb\" = 0.1234567\n\"3g.71gb\" = 1\n",
            &["at most 6 decimal places"],
        ),
        (
            "\"1g.18gb\" = true\n\"3g.71gb\" = 1\n",
            &["must be a price"],
        ),
        (
            "\"1g.18gb\" = 1\n\"3g.71gb\" = 1\n\"9g.1gb\" = 1\n",
            &["'9g.1gb' is not a MIG profile"],
        ),
        // A profile a tier offers without a price would be free by omission.
        (
            "\"1g.18gb\" = 1\n",
            &["no price for profile '3g.71gb'", "tier 'gpu'"],
        ),
    ];
    for (rates, want) in bad_rates {
        check(&base(rates, ""), want);
    }
    check(
        "[billing]\ncurrency = \"euro\"\njob_hour_without_mig = 0\n[billing.rates]\n\"1g.18gb\" = 1\n\"3g.71gb\" = 1\n",
        &["billing.currency 'euro'"],
    );
    check(
        "[billing]\ncurrency = \"EUR\"\n[billing.rates]\n\"1g.18gb\" = 1\n\"3g.71gb\" = 1\n",
        &["no job_hour_without_mig"],
    );
    let extra = base("\"1g.18gb\" = 1\n\"3g.71gb\" = 1\n", "discount = 5\n");
    check(&extra, &["unknown field `discount`"]);
    // The same prices written well are accepted.
    let c = config(root, BILLING);
    let o = tenancyctl(&c, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn statement_says_when_the_logs_do_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let c = config(root, BILLING);
    let l = january(root);
    let log = root.join("logs/n2.jsonl");
    let anchors = l.anchors.display().to_string();
    let logs = root.join("logs").display().to_string();
    let statement = |format: &str| {
        tenancyctl(
            &c,
            &[
                "report",
                "--statement",
                "2026-01",
                "--format",
                format,
                "--anchor",
                &anchors,
                &logs,
            ],
        )
    };
    // Intact: the integrity line names the node and seq verified, and the anchor check.
    let o = statement("table");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("The audit logs verify")
            && out.contains("node n1 up to seq")
            && out.contains("node n2 up to seq")
            && out.contains("the anchor check passed"),
        "{out}"
    );
    assert!(!out.contains("DO NOT VERIFY"), "{out}");

    // A record edited (the 10 h job made 1 h): the statement says so, in every format.
    let text0 = std::fs::read_to_string(&log).unwrap();
    let edited = text0.replacen("2026-01-07T10:00:00.000Z", "2026-01-07T01:00:00.000Z", 1);
    assert_ne!(edited, text0);
    std::fs::write(&log, &edited).unwrap();
    let o = statement("table");
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("THE AUDIT LOGS THIS STATEMENT WAS MADE FROM DO NOT VERIFY")
            && out.contains("record edited"),
        "{out}"
    );
    let o = statement("json");
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["integrity"]["verified"], false);
    let o = statement("csv");
    let csv = String::from_utf8_lossy(&o.stdout);
    assert!(csv.lines().skip(1).all(|l| l.ends_with(",no")), "{csv}");
    let o = statement("html");
    let html = String::from_utf8_lossy(&o.stdout);
    assert!(
        html.contains("class=\"integrity bad\"") && html.contains("DO NOT VERIFY"),
        "{html}"
    );
    if let Some(keep) = std::env::var_os("TENANCY_KEEP_STATEMENT") {
        let _ = std::fs::write(PathBuf::from(keep).join("statement-bad.html"), &*html);
    }

    // Restored, then its last records cut off: only the anchors show it.
    let cut: String = text0
        .lines()
        .take(text0.lines().count() - 2)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&log, cut).unwrap();
    let o = statement("table");
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("DO NOT VERIFY") && out.contains("tail cut off"),
        "{out}"
    );
}

/// `report --statement 2026-01 --format html --out OUT_DIR EXTRA... LOGS`, which must succeed.
fn html_statements(config: &Path, out_dir: &Path, extra: &[&str], logs: &Path) -> Output {
    let mut args = vec![
        "report",
        "--statement",
        "2026-01",
        "--format",
        "html",
        "--out",
    ];
    args.push(out_dir.to_str().unwrap());
    args.extend_from_slice(extra);
    args.push(logs.to_str().unwrap());
    let o = tenancyctl(config, &args);
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// Headless Chromium from Debian's `chromium` package, if installed.
fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn chromium_run(bin: &Path, profile: &Path, args: &[&str]) -> Output {
    // Bounded: a browser that hangs fails the test instead of holding the suite.
    Command::new("timeout")
        .arg("120")
        .arg(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            // Any fetch the page tried would fail: the statement must need none.
            "--host-resolver-rules=MAP * ~NOTFOUND",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .env("HOME", profile)
        .output()
        .unwrap()
}

#[test]
fn html_statement_renders_in_a_browser() {
    let Some(chrome) = chromium() else {
        tenancy_test_support::skip(
            "needs chromium",
            "apt-get install chromium (scripts/install-deps --tests installs it)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let c = config(root, BILLING);
    let l = january(root);
    let out_dir = root.join("statements");
    let anchors = ["--anchor", l.anchors.to_str().unwrap()];
    let o = html_statements(&c, &out_dir, &anchors, &root.join("logs"));
    let page = out_dir.join("statement-2026-01-acme.html");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(page.to_str().unwrap()),
        "{}",
        text(&o)
    );
    assert!(out_dir.join("statement-2026-01-globex.html").is_file());
    // Self-contained: no URL but the SVG namespace, no script, no external stylesheet.
    let src = std::fs::read_to_string(&page).unwrap();
    let urls: Vec<&str> = src
        .match_indices("http")
        .map(|(i, _)| &src[i..(i + 30).min(src.len())])
        .filter(|u| !u.starts_with("http://www.w3.org/2000/svg"))
        .filter(|u| !u.starts_with("http-equiv"))
        .collect();
    assert!(urls.is_empty(), "{urls:?}");
    assert!(!src.contains("<script") && !src.contains("<link"));

    // The DOM as Chromium built it from the file.
    let profile = root.join("chromium-profile");
    let url = format!("file://{}", page.display());
    let o = chromium_run(&chrome, &profile, &["--dump-dom", &url]);
    assert!(o.status.success(), "chromium: {}", text(&o));
    let dom = String::from_utf8_lossy(&o.stdout).to_string();
    // The parser's own work: a <tbody> the source never wrote.
    assert!(!src.contains("<tbody") && dom.contains("<tbody>"), "{dom}");
    for want in [
        "Statement 2026-01 — tenant acme",
        "EUR 3.83",
        "EUR 4.80",
        "EUR 1.00",
        "EUR 9.63",
        "1 job(s) were refused before they started",
        "1 job start(s) were rolled back",
        "user bob is not a member of tenant 'acme'",
        "The audit logs verify",
        "node n1 up to seq",
        "the anchor check passed",
    ] {
        assert!(dom.contains(want), "rendered DOM lacks {want:?}:\n{dom}");
    }
    // The chart: one bar per day and profile with usage (5th 1g, 6th 1g + 3g, 7th none-slice).
    let bars = dom.matches("class=\"bar\"").count();
    assert_eq!(bars, 4, "{dom}");
    assert!(dom.contains("data-day=\"2026-01-06\" data-profile=\"3g.71gb\""));

    // And a screenshot: the page paints (a PNG of the window's size, not blank).
    let shot = root.join("statement.png");
    let o = chromium_run(
        &chrome,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1000,1400",
            &url,
        ],
    );
    assert!(o.status.success(), "chromium: {}", text(&o));
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1000, 1400));
    assert!(
        png.len() > 20_000,
        "a near-empty screenshot: {} bytes",
        png.len()
    );
    if let Some(keep) = std::env::var_os("TENANCY_KEEP_STATEMENT") {
        let _ = std::fs::copy(&shot, PathBuf::from(&keep).join("statement.png"));
        let _ = std::fs::copy(&page, PathBuf::from(&keep).join("statement.html"));
    }

    // The chart's axis at a small and a large scale: every tick its own label, in a unit and
    // a precision chosen from the data, as the browser shows them.
    let small = chart_ticks(&chrome, &root.join("small"), |l| {
        // 2.16 s of one slice in the whole month: 0.0006 slice-hours.
        let from = t(5, 10, 0);
        l.job(
            "n1",
            "acme",
            1,
            Some("1g.18gb"),
            from,
            from + chrono::Duration::milliseconds(2160),
        );
    });
    assert_eq!(small.0, "seconds", "{small:?}");
    let large = chart_ticks(&chrome, &root.join("large"), |l| {
        // 1,200 slice-hours a day: 50 jobs of one slice each, for 15 days.
        for j in 0..50u64 {
            let from = t(2, 0, 0);
            let mut s = l.rec("n1", Event::JobStart, "acme", 100 + j, from);
            s.profile = Some("1g.18gb".into());
            l.append(s);
            let mut e = l.rec(
                "n1",
                Event::JobEnd,
                "acme",
                100 + j,
                from + chrono::Duration::hours(360),
            );
            e.profile = Some("1g.18gb".into());
            e.started = Some(from);
            l.append(e);
        }
    });
    assert_eq!(large.0, "hours", "{large:?}");
    assert!(
        large.1.iter().any(|t| t.contains(',')),
        "thousands grouped: {large:?}"
    );
}

/// The unit and tick labels of acme's chart in January, as Chromium renders the statement of
/// the jobs `jobs` makes.
fn chart_ticks(chrome: &Path, root: &Path, jobs: impl FnOnce(&mut Log)) -> (String, Vec<String>) {
    std::fs::create_dir_all(root).unwrap();
    let c = config(root, BILLING);
    let mut l = Log::new(root);
    jobs(&mut l);
    let out_dir = root.join("statements");
    html_statements(&c, &out_dir, &[], &root.join("logs"));
    let url = format!(
        "file://{}",
        out_dir.join("statement-2026-01-acme.html").display()
    );
    let o = chromium_run(chrome, &root.join("profile"), &["--dump-dom", &url]);
    assert!(o.status.success(), "chromium: {}", text(&o));
    let dom = String::from_utf8_lossy(&o.stdout).to_string();
    let texts = |class: &str| -> Vec<String> {
        dom.split(&format!("class=\"{class}\""))
            .skip(1)
            .map(|rest| {
                let v = &rest[rest.find('>').unwrap() + 1..];
                v[..v.find('<').unwrap()].to_string()
            })
            .collect()
    };
    let ticks = texts("tick");
    let unit = texts("axis-unit").pop().unwrap_or_default();
    assert_eq!(ticks.len(), 5, "{dom}");
    let values: Vec<f64> = ticks
        .iter()
        .map(|t| t.replace(',', "").parse().unwrap())
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "tick labels not distinct and rising: {ticks:?} ({unit})"
    );
    // The tallest bar fits under the axis top.
    assert!(values[4] > 0.0);
    (unit, ticks)
}

#[test]
fn compare_sacct_finds_a_job_without_records() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let c = config(root, BILLING);
    let mut l = Log::new(root);
    l.job("n1", "acme", 11, Some("1g.18gb"), t(5, 10, 0), t(5, 11, 0));
    l.job("n1", "acme", 12, None, t(5, 12, 0), t(5, 12, 30));
    l.job("n1", "acme", 15, Some("1g.18gb"), t(6, 10, 0), t(6, 11, 0));
    l.job(
        "n1",
        "globex",
        16,
        Some("3g.71gb"),
        t(7, 10, 0),
        t(7, 10, 10),
    );
    let logs = root.join("logs");
    let header = "JobIDRaw|Cluster|NodeList|State|Start|End|ElapsedRaw|AllocTRES\n";
    let row = |id: u64, state: &str, secs: u64, tres: &str| {
        format!("{id}|c|n1|{state}|2026-01-05T10:00:00|2026-01-05T11:00:00|{secs}|billing=1,cpu=1,{tres}node=1\n")
    };
    let agreeing = format!(
        "{header}{}{}{}{}",
        row(11, "COMPLETED", 3600 + 20, "gres/gpu:1g.18gb=1,gres/gpu=1,"),
        row(12, "COMPLETED", 1800, ""),
        row(15, "COMPLETED", 3600, "gres/gpu:1g.18gb=1,gres/gpu=1,"),
        row(16, "COMPLETED", 600, "gres/gpu:3g.71gb=1,gres/gpu=1,"),
    );
    let compare = |sacct: &str| {
        let f = root.join("sacct.txt");
        std::fs::write(&f, sacct).unwrap();
        let (f, logs) = (f.to_str().unwrap(), logs.to_str().unwrap());
        let mut args = vec!["report", "--compare-sacct", "--statement", "2026-01"];
        args.extend(["--sacct-file", f, logs]);
        tenancyctl(&c, &args)
    };
    let o = compare(&agreeing);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("4 Slurm job(s), 4 job_start record(s)")
            && text(&o).contains("the books agree"),
        "{}",
        text(&o)
    );

    // Slurm ran job 13, which left no record; job 16 is gone from Slurm's books; job 15 ran
    // two hours by Slurm against one by the audit log; a job held after a refused prolog
    // (pending) is nobody's disagreement.
    let disagreeing = format!(
        "{header}{}{}{}{}{}{}",
        row(11, "COMPLETED", 3600, "gres/gpu:1g.18gb=1,gres/gpu=1,"),
        row(12, "COMPLETED", 1800, ""),
        row(13, "COMPLETED", 300, "gres/gpu:1g.18gb=1,gres/gpu=1,"),
        row(15, "COMPLETED", 7200, "gres/gpu:1g.18gb=1,gres/gpu=1,"),
        row(17, "PENDING", 0, ""),
        "11.batch|c|n1|COMPLETED|x|y|3600|cpu=1\n",
    );
    let o = compare(&disagreeing);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("DISAGREE job 13 on n1: no_job_start"), "{out}");
    assert!(out.contains("DISAGREE job 16 on n1: no_slurm_job"), "{out}");
    assert!(
        out.contains("DISAGREE job 15 on n1: usage_differs")
            && out.contains("differ by 3600.0 s, more than the tolerance of 60 s"),
        "{out}"
    );
    assert_eq!(out.matches("DISAGREE").count(), 3, "{out}");
    assert!(out.contains("3 disagreement(s)"), "{out}");

    // JSON carries the same.
    let f = root.join("sacct.txt");
    let o = tenancyctl(
        &c,
        &[
            "report",
            "--compare-sacct",
            "--since",
            "2026-01-01",
            "--until",
            "2026-01-31",
            "--sacct-file",
            f.to_str().unwrap(),
            "--format",
            "json",
            logs.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let kinds: Vec<&Value> = doc["disagreements"].as_array().unwrap().iter().collect();
    let kinds: Vec<&str> = kinds.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["no_job_start", "usage_differs", "no_slurm_job"]);
    // A usage disagreement says which book counts more, and for which profile.
    let usage = &doc["disagreements"][1];
    assert_eq!(usage["profile"], "1g.18gb", "{usage}");
    assert_eq!(usage["audit_ms"], 3_600_000, "{usage}");
    assert_eq!(usage["slurm_ms"], 7_200_000, "{usage}");
    assert!(doc["disagreements"][0].get("audit_ms").is_none());
}

/// A job Slurm requeued (`scontrol requeue`, a preemption) runs again, maybe on another node:
/// `sacct -D` lists each run. Every run's nodes are the job's, and its slice-hours are the sum
/// of every run's, on both books.
#[test]
fn compare_sacct_counts_every_run_of_a_requeued_job() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let c = config(root, BILLING);
    let mut l = Log::new(root);
    // Job 21: half an hour on n1, preempted, then half an hour on n2. Job 22: twice on n1.
    l.job("n1", "acme", 21, Some("1g.18gb"), t(5, 10, 0), t(5, 10, 30));
    l.job(
        "n2",
        "acme",
        21,
        Some("1g.18gb"),
        t(5, 10, 40),
        t(5, 11, 10),
    );
    l.job("n1", "acme", 22, Some("1g.18gb"), t(6, 10, 0), t(6, 10, 20));
    l.job("n1", "acme", 22, Some("1g.18gb"), t(6, 11, 0), t(6, 11, 40));
    let logs = root.join("logs");
    let header = "JobIDRaw|Cluster|NodeList|State|Start|End|ElapsedRaw|AllocTRES\n";
    let row = |id: u64, node: &str, state: &str, secs: u64| {
        format!(
            "{id}|c|{node}|{state}|2026-01-05T10:00:00|2026-01-05T11:00:00|{secs}|\
             billing=1,cpu=1,gres/gpu:1g.18gb=1,gres/gpu=1,node=1\n"
        )
    };
    let compare = |sacct: &str| {
        let f = root.join("sacct.txt");
        std::fs::write(&f, sacct).unwrap();
        let (f, logs) = (f.to_str().unwrap(), logs.to_str().unwrap());
        let mut args = vec!["report", "--compare-sacct", "--statement", "2026-01"];
        args.extend(["--sacct-file", f, logs]);
        tenancyctl(&c, &args)
    };
    let agreeing = format!(
        "{header}{}{}{}{}",
        row(21, "n1", "PREEMPTED", 1800),
        row(21, "n2", "COMPLETED", 1800),
        row(22, "n1", "REQUEUED", 1200),
        row(22, "n1", "COMPLETED", 2400),
    );
    let o = compare(&agreeing);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("2 Slurm job(s), 3 job_start record(s), 2 usage figure(s) compared")
            && text(&o).contains("the books agree"),
        "{}",
        text(&o)
    );

    // Slurm's second run of job 21 ran an hour, not half of one: the sum differs by 30 min.
    let o = compare(&format!(
        "{header}{}{}{}{}",
        row(21, "n1", "PREEMPTED", 1800),
        row(21, "n2", "COMPLETED", 3600),
        row(22, "n1", "REQUEUED", 1200),
        row(22, "n1", "COMPLETED", 2400),
    ));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("DISAGREE job 21 on n1,n2: usage_differs")
            && out.contains("differ by 1800.0 s"),
        "{out}"
    );
    assert_eq!(out.matches("DISAGREE").count(), 1, "{out}");
}

/// A run whose end the audit log lacks is listed with what the log has instead: nothing (its
/// epilog's job_end kept out by a full audit disk), even when an earlier run's epilog wrote a
/// "no journal" job_end; or a reconcile record, when something other than the epilog tore the
/// run down. Found by the soak at size (job 2892).
#[test]
fn compare_sacct_says_what_ended_a_run_without_a_job_end() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let c = config(root, BILLING);
    let mut l = Log::new(root);
    // Job 31: its first run rolled back in the prolog (and requeued), whose epilog found no
    // journal; its second run's job_end never written.
    l.incident(Event::Rollback, "acme", 31, t(7, 9, 0), "audit log full");
    l.no_journal_end("acme", 31, t(7, 9, 1));
    l.start("acme", 31, "1g.18gb", t(7, 9, 5));
    // Job 32: its epilog lost; another job's prolog tore it down. Job 34: the same, but the
    // teardown failed.
    for (id, outcome) in [(32, Outcome::Success), (34, Outcome::Failure)] {
        l.start("acme", id, "1g.18gb", t(7, 10, 0));
        let mut r = l.rec("n1", Event::Reconcile, "acme", id, t(7, 10, 30));
        r.outcome = outcome;
        r.reason = Some(format!("job {id}: Slurm no longer runs the job on n1"));
        l.append(r);
    }
    // Job 33 ended as it should, after a first run with no journal: the books agree.
    l.no_journal_end("acme", 33, t(7, 11, 0));
    l.job(
        "n1",
        "acme",
        33,
        Some("1g.18gb"),
        t(7, 11, 10),
        t(7, 11, 20),
    );

    let header = "JobIDRaw|Cluster|NodeList|State|Start|End|ElapsedRaw|AllocTRES\n";
    let row = |id: u64, state: &str, secs: u64| {
        format!(
            "{id}|c|n1|{state}|2026-01-07T09:00:00|2026-01-07T09:10:00|{secs}|\
             billing=1,cpu=1,gres/gpu:1g.18gb=1,gres/gpu=1,node=1\n"
        )
    };
    let sacct = format!(
        "{header}{}{}{}{}{}{}",
        row(31, "REQUEUED", 0),
        row(31, "COMPLETED", 2),
        row(32, "COMPLETED", 60),
        row(33, "REQUEUED", 0),
        row(33, "COMPLETED", 600),
        row(34, "COMPLETED", 60),
    );
    let f = root.join("sacct.txt");
    std::fs::write(&f, sacct).unwrap();
    let (f, logs) = (f.to_str().unwrap(), root.join("logs"));
    let o = tenancyctl(
        &c,
        &[
            "report",
            "--compare-sacct",
            "--since",
            "2026-01-01",
            "--until",
            "2026-01-31",
            "--sacct-file",
            f,
            "--format",
            "json",
            logs.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let d: Vec<(u64, &str, &str)> = doc["disagreements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["job_id"].as_u64().unwrap(),
                d["kind"].as_str().unwrap(),
                d["detail"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(d.len(), 3, "{d:?}");
    assert_eq!((d[0].0, d[0].1), (31, "usage_differs"), "{d:?}");
    assert!(
        d[0].2.contains("(COMPLETED, 2 s)")
            && d[0].2.contains("on n1 nothing after its last job_start"),
        "{d:?}"
    );
    assert_eq!((d[1].0, d[1].1), (32, "usage_differs"), "{d:?}");
    assert!(
        d[1].2
            .contains("on n1 a reconcile record at 2026-01-07T10:30:00"),
        "{d:?}"
    );
    assert_eq!((d[2].0, d[2].1), (34, "usage_differs"), "{d:?}");
    assert!(
        d[2].2
            .contains("on n1 a reconcile record at 2026-01-07T10:30:00")
            && d[2].2.contains("failed to tear its last run down"),
        "{d:?}"
    );
}
