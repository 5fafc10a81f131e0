//! Where a document (or an item of a `kind: List`) is: the `origin` of its services and the
//! place its errors point at.

use std::fmt;

use super::ConvertError;

/// Where a document (or an item of a `kind: List`) is, for origins and error messages.
#[derive(Clone, Copy)]
pub(super) struct DocRef<'a> {
    pub(super) file: &'a str,
    /// 1-based document number in the file.
    pub(super) document: usize,
    /// 0-based index in a `kind: List`'s `items`.
    pub(super) item: Option<usize>,
}

impl fmt::Display for DocRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file {}, document {}", self.file, self.document)?;
        if let Some(i) = self.item {
            write!(f, ", items[{i}]")?;
        }
        Ok(())
    }
}

impl DocRef<'_> {
    /// `file x, document n (Kind ns/name)`: the origin of a service, or the location of an error
    /// once the resource name is known.
    pub(super) fn describe(&self, kind: &str, resource: Option<&str>) -> String {
        match resource {
            Some(r) => format!("{self} ({kind} {r})"),
            None => self.to_string(),
        }
    }

    /// Field path relative to the document: inside a List, paths start at `items[i]`.
    fn field(&self, path: &str) -> String {
        let path = path.trim_start_matches('.');
        match (self.item, path.is_empty()) {
            (Some(i), true) => format!("items[{i}]"),
            (Some(i), false) => format!("items[{i}].{path}"),
            (None, _) => path.to_owned(),
        }
    }

    pub(super) fn invalid(
        &self,
        at: String,
        path: &str,
        message: impl Into<String>,
    ) -> ConvertError {
        ConvertError::Invalid {
            at,
            field: self.field(path),
            message: message.into(),
        }
    }
}
