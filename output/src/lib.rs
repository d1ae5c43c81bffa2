//! The `--format` option every `tenancyctl` command that prints results takes. Each layer crate
//! prints its own rows; they share this one definition of the choice.

/// Output format of a printing command: an aligned table (the default), CSV or JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Csv,
    Json,
}
