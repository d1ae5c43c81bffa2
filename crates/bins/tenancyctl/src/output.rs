//! Printing rows as a table, CSV or JSON (`--format`), the same way for every command.

use serde::Serialize;

/// `--format` of every command that prints results: an aligned table (the default), CSV or
/// JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Csv,
    Json,
}

/// How tenancy-accounting's writers lay out what `--format` asks.
pub fn render(format: Format) -> tenancy_accounting::Render {
    match format {
        Format::Table => tenancy_accounting::Render::Table,
        Format::Csv => tenancy_accounting::Render::Csv,
        Format::Json => tenancy_accounting::Render::Json,
    }
}

/// Rows of one kind with their column headers.
pub struct Rows<'a, T: Serialize> {
    pub headers: &'a [&'a str],
    pub rows: &'a [T],
    /// The cells of one row, in header order, for table and CSV.
    pub cells: fn(&T) -> Vec<String>,
}

impl<T: Serialize> Rows<'_, T> {
    pub fn print(&self, format: Format) -> anyhow::Result<()> {
        match format {
            Format::Json => println!("{}", serde_json::to_string_pretty(self.rows)?),
            Format::Csv => {
                let mut w = csv::Writer::from_writer(std::io::stdout());
                w.write_record(self.headers)?;
                for r in self.rows {
                    w.write_record((self.cells)(r))?;
                }
                w.flush()?;
            }
            Format::Table => {
                let mut t = comfy_table::Table::new();
                t.load_preset(comfy_table::presets::NOTHING);
                t.set_header(self.headers.iter().map(|h| h.to_uppercase()));
                for r in self.rows {
                    t.add_row((self.cells)(r));
                }
                // Long cells (doctor's messages and remedies) wrap to the terminal's width
                // instead of making rows of hundreds of columns; piped output without
                // COLUMNS keeps one line per row, for grep.
                if let Some(width) = terminal_width(&t) {
                    t.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
                    t.set_width(width);
                }
                println!("{t}");
            }
        }
        Ok(())
    }
}

/// The width tables fit: `COLUMNS` when set (what shells export, and what a script can set),
/// else the terminal's when stdout is one; `None` (no wrapping) otherwise.
fn terminal_width(t: &comfy_table::Table) -> Option<u16> {
    match std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<u16>().ok())
    {
        Some(w) if w >= 20 => Some(w),
        _ => t.width().filter(|_| t.is_tty()),
    }
}
