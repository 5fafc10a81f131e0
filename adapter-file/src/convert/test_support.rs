//! Helpers shared by the conversion tests.

use mcp_core::model::Labels;

use super::{parse, Format};

pub(crate) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub(crate) fn err(file: &str, text: &str, format: Format) -> String {
    match parse(file, text, format) {
        Ok(services) => panic!("expected an error, got {services:?}"),
        Err(e) => e.to_string(),
    }
}
