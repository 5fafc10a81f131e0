//! The one error a file's conversion can end with.

/// Why a file could not be converted. The whole file is rejected (the caller keeps its last good
/// services), so one error is enough; its text names where to look.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The text is not valid YAML/JSON.
    #[error("{at}: {format} syntax error: {message}")]
    Syntax {
        /// `file x.yaml, document 2`.
        at: String,
        /// `YAML` or `JSON`.
        format: &'static str,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The document parsed but does not have the expected shape.
    #[error("{at}: {}{message}", field_prefix(.field))]
    Invalid {
        /// `file x.yaml, document 2 (ServiceEntry default/payments)`.
        at: String,
        /// Path of the offending field (`spec.ports[0].number`), empty for the document itself.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}
