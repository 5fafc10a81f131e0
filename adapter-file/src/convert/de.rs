//! Typed deserialization of a parsed document, with errors that name the failing field.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use yaml_serde::Value;

use super::{ConvertError, DocRef};

/// Reads a string field of a mapping without deserializing the rest, to dispatch on `kind` and
/// to name the resource in errors about other fields.
pub(super) fn str_field<'v>(value: &'v Value, path: &[&str]) -> Option<&'v str> {
    let mut v = value;
    for key in path {
        v = v.get(key)?;
    }
    v.as_str()
}

/// Deserializes `value` into `T`, naming the failing field (prefixed with `prefix`) on error.
pub(super) fn typed<T: DeserializeOwned>(
    doc: DocRef<'_>,
    at: &str,
    prefix: &str,
    value: Value,
) -> Result<T, ConvertError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let inner = inner.trim_start_matches('.');
        let path = match (prefix.is_empty(), inner.is_empty()) {
            (_, true) => prefix.to_owned(),
            (true, false) => inner.to_owned(),
            (false, false) => format!("{prefix}.{inner}"),
        };
        doc.invalid(at.to_owned(), &path, e.into_inner().to_string())
    })
}

/// Accepts `null` (a YAML key with no value) as the default: `ports:` with nothing under it
/// means "no ports", not a type error.
pub(super) fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
