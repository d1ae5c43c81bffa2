//! The statement as a self-contained HTML page per tenant: inline CSS, an SVG chart of the
//! month's slice-hours per day, nothing fetched.

use super::{hours, incident_words, money, profile_name, rate_text, NO_SLICE};
use super::{Statement, TenantStatement};
use crate::report::parse_month;
use anyhow::Context;
use std::io::Write;
use std::path::Path;

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const PALETTE: [&str; 8] = [
    "#2f6db5", "#e07b28", "#3a9a4a", "#c23b3b", "#7d57b0", "#8c6239", "#d26fb1", "#6b7280",
];

/// A stacked bar chart of usage per day and profile (hours), as inline SVG.
fn chart(s: &Statement, t: &TenantStatement) -> String {
    let (start, end) = parse_month(&s.month).expect("month parsed before");
    let days = (end - start).num_days().max(1) as usize;
    let mut profiles: Vec<String> = t
        .daily_ms
        .values()
        .flat_map(|m| m.keys().cloned())
        .collect();
    profiles.sort();
    profiles.dedup();
    let max_ms = t
        .daily_ms
        .values()
        .map(|m| m.values().sum::<u64>())
        .max()
        .unwrap_or(0);
    let axis = Axis::for_hours(max_ms as f64 / 3_600_000.0);
    // Bars are drawn against the axis top, in hours.
    let top = axis.top_hours();
    let (w, h, left, right, top_m, bottom) = (760.0, 280.0, 56.0, 16.0, 16.0, 64.0);
    let plot_w = w - left - right;
    let plot_h = h - top_m - bottom;
    let bw = plot_w / days as f64;
    let mut o = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="Usage per day and profile, {tenant}, {month}" class="chart">"##,
        tenant = esc(&t.tenant),
        month = esc(&s.month)
    );
    for i in 0..=Axis::TICKS {
        let y = top_m + plot_h - plot_h * i as f64 / Axis::TICKS as f64;
        o.push_str(&format!(
            r##"<line x1="{left}" x2="{x2}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text class="tick" x="{tx}" y="{ty:.1}" font-size="11" text-anchor="end">{v}</text>"##,
            x2 = w - right,
            tx = left - 6.0,
            ty = y + 4.0,
            v = axis.label(i),
        ));
    }
    o.push_str(&format!(
        r##"<text class="axis-unit" x="14" y="{y:.1}" font-size="11" transform="rotate(-90 14 {y:.1})" text-anchor="middle">{unit}</text>"##,
        y = top_m + plot_h / 2.0,
        unit = axis.unit
    ));
    for d in 0..days {
        let date = start + chrono::Duration::days(d as i64);
        let key = date.format("%Y-%m-%d").to_string();
        let x = left + bw * d as f64;
        let mut y = top_m + plot_h;
        if let Some(m) = t.daily_ms.get(&key) {
            for (pi, p) in profiles.iter().enumerate() {
                let Some(ms) = m.get(p) else { continue };
                let hh = plot_h * (*ms as f64 / 3_600_000.0) / top;
                y -= hh;
                o.push_str(&format!(
                    r##"<rect class="bar" data-day="{key}" data-profile="{pe}" x="{x:.1}" y="{y:.1}" width="{bwi:.1}" height="{hh:.1}" fill="{c}"><title>{key} {pn}: {q} h</title></rect>"##,
                    pe = esc(p),
                    bwi = (bw - 2.0).max(1.0),
                    c = PALETTE[pi % PALETTE.len()],
                    pn = esc(profile_name((p != NO_SLICE).then_some(p))),
                    q = hours(*ms).round_dp(3),
                ));
            }
        }
        if d % 2 == 0 || days <= 16 {
            o.push_str(&format!(
                r##"<text x="{tx:.1}" y="{ty}" font-size="10" text-anchor="middle">{n}</text>"##,
                tx = x + bw / 2.0,
                ty = top_m + plot_h + 14.0,
                n = d + 1
            ));
        }
    }
    o.push_str(&format!(
        r##"<line x1="{left}" x2="{x2}" y1="{y}" y2="{y}" stroke="#333"/>"##,
        x2 = w - right,
        y = top_m + plot_h
    ));
    let mut lx = left;
    let ly = h - 18.0;
    for (pi, p) in profiles.iter().enumerate() {
        let name = profile_name((p != NO_SLICE).then_some(p));
        o.push_str(&format!(
            r##"<rect x="{lx:.1}" y="{ry:.1}" width="12" height="12" fill="{c}"/><text x="{tx:.1}" y="{ly:.1}" font-size="12">{n}</text>"##,
            ry = ly - 10.0,
            c = PALETTE[pi % PALETTE.len()],
            tx = lx + 16.0,
            n = esc(name),
        ));
        lx += 24.0 + 7.0 * name.len() as f64;
    }
    if profiles.is_empty() {
        o.push_str(&format!(
            r##"<text x="{x}" y="{y}" font-size="13" text-anchor="middle">no usage this month</text>"##,
            x = left + plot_w / 2.0,
            y = top_m + plot_h / 2.0
        ));
    }
    o.push_str("</svg>");
    o
}

/// The chart's value axis: its unit and its ticks chosen from the data, so that every tick has
/// a label of its own at any scale (a month of 0.0006 slice-hours is 0, 0.5, 1, 1.5, 2 ... seconds,
/// not 0, 0, 0.001, 0.001, 0.001 hours).
#[derive(Debug, Clone, PartialEq)]
struct Axis {
    unit: &'static str,
    /// Units per hour.
    per_hour: f64,
    /// Between two ticks, in the unit.
    step: f64,
    /// Decimals that write every tick exactly.
    decimals: usize,
}

impl Axis {
    const TICKS: usize = 4;

    fn for_hours(max_h: f64) -> Axis {
        let (unit, per_hour) = if max_h >= 1.0 {
            ("hours", 1.0)
        } else if max_h * 60.0 >= 1.0 {
            ("minutes", 60.0)
        } else {
            ("seconds", 3600.0)
        };
        let v = max_h * per_hour;
        let raw = if v > 0.0 {
            v / Self::TICKS as f64
        } else {
            0.25
        };
        // A round step: 1, 2, 2.5 or 5 times a power of ten, the smallest whose ticks reach v.
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|st| *st * Self::TICKS as f64 >= v * (1.0 - 1e-12))
            .unwrap_or(10.0 * mag);
        let decimals = (0..=9)
            .find(|d| {
                let scaled = step * 10f64.powi(*d as i32);
                (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
            })
            .unwrap_or(9);
        Axis {
            unit,
            per_hour,
            step,
            decimals,
        }
    }

    fn top_hours(&self) -> f64 {
        self.step * Self::TICKS as f64 / self.per_hour
    }

    /// The label of tick `i` (0 at the bottom), thousands grouped.
    fn label(&self, i: usize) -> String {
        let s = format!("{:.*}", self.decimals, self.step * i as f64);
        let (int, frac) = s
            .split_once('.')
            .map_or((s.as_str(), None), |(a, b)| (a, Some(b)));
        let mut grouped = String::new();
        for (k, ch) in int.chars().enumerate() {
            if k > 0 && (int.len() - k) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(ch);
        }
        match frac {
            Some(f) => format!("{grouped}.{f}"),
            None => grouped,
        }
    }
}

const CSS: &str = "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:2em;color:#1f2937}\
h1{font-size:1.5em;margin-bottom:.2em}.sub{color:#555;margin-top:0}\
.integrity{padding:.8em 1em;border-radius:6px;margin:1em 0}\
.ok{background:#e7f5ea;border:1px solid #3a9a4a}.bad{background:#fde8e8;border:2px solid #c23b3b;font-weight:bold}\
.warn{background:#fff7e0;border:1px solid #e0a800}\
table{border-collapse:collapse;margin:1em 0;min-width:640px}th,td{padding:.35em .8em;border-bottom:1px solid #ddd}\
th{text-align:left;background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}\
tr.total td{font-weight:bold;border-top:2px solid #333}\
section.tenant{page-break-after:always}footer{color:#666;font-size:.85em;margin-top:2em}";

/// One tenant's statement as a complete HTML page section.
fn tenant_html(s: &Statement, t: &TenantStatement) -> String {
    let cur = s.currency.as_deref();
    let mut o = String::new();
    o.push_str(&format!(
        "<section class=\"tenant\" id=\"tenant-{te}\"><h1>Statement {m} — tenant {te}</h1>\
         <p class=\"sub\">Cluster {c}. Usage from the product's audit logs: MIG slice-hours per \
         profile, job-hours for jobs without a MIG slice.</p>",
        te = esc(&t.tenant),
        m = esc(&s.month),
        c = esc(s.cluster.as_deref().unwrap_or("(not named)")),
    ));
    let class = if !s.integrity.verified {
        "bad"
    } else if s.integrity.anchors_checked {
        "ok"
    } else {
        "warn"
    };
    o.push_str(&format!(
        "<p class=\"integrity {class}\">{}</p>",
        esc(&s.integrity.sentence)
    ));
    o.push_str(
        "<table class=\"lines\"><thead><tr><th>Profile</th><th>Unit</th><th>Jobs</th>\
         <th>Quantity</th><th>Rate</th><th>Amount</th></tr></thead>",
    );
    for l in &t.lines {
        o.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.4}</td>\
             <td class=\"n\">{}</td><td class=\"n amount\">{}</td></tr>",
            esc(profile_name(l.profile.as_deref())),
            l.unit,
            l.jobs,
            l.quantity,
            esc(&rate_text(l.rate, l.unit, cur)),
            esc(&money(l.amount, cur)),
        ));
    }
    if t.lines.is_empty() {
        o.push_str("<tr><td colspan=\"6\">No usage this month.</td></tr>");
    }
    o.push_str(&format!(
        "<tr class=\"total\"><td>Total</td><td></td><td class=\"n\">{}</td><td></td><td></td>\
         <td class=\"n amount total\">{}</td></tr></table>",
        t.lines.iter().map(|l| l.jobs).sum::<u64>(),
        esc(&money(t.total_amount, cur)),
    ));
    if s.currency.is_none() {
        o.push_str(
            "<p class=\"warn integrity\">No [billing] prices in the config: quantities only.</p>",
        );
    }
    o.push_str("<h2>Usage per day</h2>");
    o.push_str(&chart(s, t));
    o.push_str("<h2>Refusals, rollbacks and teardown failures</h2><ul class=\"incidents\">");
    for w in incident_words(t) {
        o.push_str(&format!("<li>{}</li>", esc(&w)));
    }
    o.push_str("</ul>");
    if !t.incidents.is_empty() {
        o.push_str(
            "<table class=\"incidents\"><thead><tr><th>Time (UTC)</th><th>Node</th><th>Job</th>\
             <th>Event</th><th>Reason</th></tr></thead>",
        );
        for i in &t.incidents {
            o.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&i.time),
                esc(&i.node),
                i.job_id.map(|j| j.to_string()).unwrap_or_default(),
                esc(&i.event),
                esc(&i.reason),
            ));
        }
        o.push_str("</table>");
    }
    o.push_str(&format!(
        "<footer>Made by tenancyctl from {} audit record(s){}{}. Amounts: each line's exact \
         milliseconds × its rate, rounded to the cent (half away from zero); the total is the \
         sum of the lines.</footer></section>",
        s.records,
        if s.malformed > 0 {
            format!(", {} malformed line(s) skipped", s.malformed)
        } else {
            String::new()
        },
        if s.open_starts > 0 {
            format!(
                ", {} job(s) without a recorded end not billed (still running, or the end was \
                 not recorded)",
                s.open_starts
            )
        } else {
            String::new()
        },
    ));
    o
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\
         <title>{}</title><style>{CSS}</style></head><body>{body}</body></html>\n",
        esc(title)
    )
}

/// The tenant's part of a file name. Names come from the logs, which may have been tampered
/// with: only a valid tenant name goes into a path, anything else (`../x`, the `-` of records
/// without a tenant) becomes a fixed form.
fn file_part(tenant: &str) -> String {
    if tenant != NO_SLICE && tenancy_config::valid_name(tenant) {
        tenant.to_string()
    } else {
        let h: String = tenant
            .bytes()
            .map(|b| format!("{b:02x}"))
            .take(32)
            .collect();
        format!("_no-valid-tenant-{h}")
    }
}

/// The HTML statement: one page per tenant in `dir` (returned), or every tenant in one page.
pub fn write_html(s: &Statement, dir: Option<&Path>, out: &mut dyn Write) -> anyhow::Result<()> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating --out folder {}", dir.display()))?;
            if s.tenants.is_empty() {
                writeln!(
                    out,
                    "statement {}: no usage recorded; no file written",
                    s.month
                )?;
            }
            for t in &s.tenants {
                let name = format!("statement-{}-{}.html", s.month, file_part(&t.tenant));
                let path = dir.join(&name);
                let tmp = dir.join(format!(".{name}.tmp"));
                std::fs::write(
                    &tmp,
                    page(
                        &format!("Statement {} — {}", s.month, t.tenant),
                        &tenant_html(s, t),
                    ),
                )
                .with_context(|| format!("writing {}", tmp.display()))?;
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("renaming to {}", path.display()))?;
                writeln!(out, "{}", path.display())?;
            }
        }
        None => {
            let mut body = String::new();
            for t in &s.tenants {
                body.push_str(&tenant_html(s, t));
            }
            if s.tenants.is_empty() {
                body.push_str(&format!(
                    "<h1>Statement {}</h1><p class=\"integrity {}\">{}</p><p>No usage recorded.</p>",
                    esc(&s.month),
                    if s.integrity.verified { "ok" } else { "bad" },
                    esc(&s.integrity.sentence)
                ));
            }
            out.write_all(page(&format!("Statement {}", s.month), &body).as_bytes())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_name_from_the_logs_never_leaves_the_out_folder() {
        assert_eq!(file_part("acme"), "acme");
        assert_eq!(file_part("-"), "_no-valid-tenant-2d");
        let p = file_part("../../etc/x");
        assert!(!p.contains('/') && !p.contains(".."), "{p}");
    }

    #[test]
    fn axis_ticks_are_distinct_at_any_scale() {
        for max_h in [
            0.0, 0.0006, 0.004, 0.2, 0.9, 1.0, 3.7, 99.0, 12_345.0, 2.5e6,
        ] {
            let a = super::Axis::for_hours(max_h);
            let labels: Vec<String> = (0..=super::Axis::TICKS).map(|i| a.label(i)).collect();
            let mut d = labels.clone();
            d.dedup();
            assert_eq!(d.len(), labels.len(), "{max_h}: {labels:?}");
            assert!(a.top_hours() >= max_h, "{max_h}: {a:?}");
            assert!(
                a.top_hours() <= (max_h * 2.6).max(0.001),
                "{max_h}: {a:?} too tall"
            );
        }
        let small = super::Axis::for_hours(0.0006);
        assert_eq!(small.unit, "seconds");
        let big = super::Axis::for_hours(12_345.0);
        assert_eq!(big.label(4), "20,000");
    }
}
