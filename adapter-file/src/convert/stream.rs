//! One document read as it is parsed, so a large file never exists as one value tree.
//!
//! A CMDB export is often one document: an `Inventory` with 100,000 `services`, or a `List`
//! with as many `items`. Parsed into one [`Value`] first, such a document held the whole tree
//! (several times the file's size) next to the services converted from it. Here the top-level
//! mapping is read key by key: each element of `services` or `items` is read into a small
//! [`Value`] of its own, converted at once and dropped, and the document keeps an empty
//! sequence in its place. Every other field is kept as a [`Value`], so the document's own
//! checks (`kind`, `apiVersion`, unknown fields) run on it afterwards as before, and errors read
//! as they did (see [`super::finish`]).
//!
//! Elements are converted before the fields after them are known (kubectl writes `items` before
//! `kind`; `namespace` may follow `services`). That is why services are converted without their
//! namespace and re-keyed once the document ends, and why an element's error is kept and only
//! reported if the document turns out to be what the element was read for.

use std::marker::PhantomData;

use mcp_core::model::Service;
use serde::de::value::{EnumAccessDeserializer, MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde::Deserialize;
use yaml_serde::{Mapping, Value};

use super::de::str_field;
use super::inventory::inventory_service;
use super::{convert_document, ConvertError, DocRef};

/// How one value of the input becomes a [`Value`]: the same way the whole document used to.
pub(super) trait Values {
    /// Whether a key given twice is an error (YAML) or the last one wins (JSON).
    const DUPLICATES_ARE_ERRORS: bool;

    fn value<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error>;
}

/// YAML: straight into a [`Value`] (the parser's limits apply as before).
pub(super) struct Yaml;

impl Values for Yaml {
    const DUPLICATES_ARE_ERRORS: bool = true;

    fn value<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
}

/// JSON: through `serde_json`'s value, as whole JSON files were converted before.
pub(super) struct Json;

impl Values for Json {
    const DUPLICATES_ARE_ERRORS: bool = false;

    fn value<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        let json = serde_json::Value::deserialize(d)?;
        yaml_serde::to_value(json).map_err(de::Error::custom)
    }
}

/// A streamed document: its fields with `services`/`items` emptied, and what they converted to.
pub(super) struct Document {
    /// The document; `Null` for an empty one.
    pub(super) value: Value,
    /// The top-level `items`, each converted as a document of its own, when it was a sequence.
    pub(super) items: Option<Converted>,
    /// The top-level `services`, each converted as an inventory service without a namespace,
    /// when it was a sequence.
    pub(super) services: Option<Converted>,
}

/// What a streamed sequence converted to, up to its first error.
#[derive(Default)]
pub(super) struct Converted {
    pub(super) services: Vec<Service>,
    /// The first element that failed: its error and, for an inventory service, its `name`
    /// (to name it with the namespace once that is known).
    pub(super) error: Option<(ConvertError, Option<String>)>,
}

/// Reads one document (the whole input of a JSON file, one `---` document of a YAML file).
pub(super) struct DocumentSeed<'a, V> {
    doc: DocRef<'a>,
    values: PhantomData<V>,
}

impl<'a, V: Values> DocumentSeed<'a, V> {
    pub(super) fn new(doc: DocRef<'a>) -> Self {
        Self {
            doc,
            values: PhantomData,
        }
    }
}

impl<'de, V: Values> DeserializeSeed<'de> for DocumentSeed<'_, V> {
    type Value = Document;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Document, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, V: Values> Visitor<'de> for DocumentSeed<'_, V> {
    type Value = Document;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Document, A::Error> {
        let mut rest = Mapping::new();
        let mut items = None;
        let mut services = None;
        while let Some(key) = map.next_key_seed(ValueSeed::<V>(PhantomData))? {
            if V::DUPLICATES_ARE_ERRORS && rest.contains_key(&key) {
                return Err(de::Error::custom(duplicate(&key)));
            }
            let streamed = match key.as_str() {
                Some("items") => Some((Element::Item, &mut items)),
                Some("services") => Some((Element::Service, &mut services)),
                _ => None,
            };
            let value = match streamed {
                Some((element, slot)) => {
                    let seed = SequenceSeed::<V> {
                        doc: self.doc,
                        element,
                        values: PhantomData,
                    };
                    match map.next_value_seed(seed)? {
                        Sequence::Converted(converted) => {
                            *slot = Some(converted);
                            Value::Sequence(Vec::new())
                        }
                        Sequence::Other(value) => {
                            *slot = None;
                            value
                        }
                    }
                }
                None => map.next_value_seed(ValueSeed::<V>(PhantomData))?,
            };
            rest.insert(key, value);
        }
        Ok(Document {
            value: Value::Mapping(rest),
            items,
            services,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Document, A::Error> {
        whole(V::value(SeqAccessDeserializer::new(seq))?)
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Document, A::Error> {
        whole(V::value(EnumAccessDeserializer::new(data))?)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Document, E> {
        whole(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Document, E> {
        whole(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Document, E> {
        whole(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Document, E> {
        whole(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Document, E> {
        whole(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Document, E> {
        whole(Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Document, E> {
        whole(Value::String(v.to_owned()))
    }
}

/// A document that is not a mapping: nothing to stream.
fn whole<E>(value: Value) -> Result<Document, E> {
    Ok(Document {
        value,
        items: None,
        services: None,
    })
}

/// Worded as the YAML parser words it when it builds a mapping.
fn duplicate(key: &Value) -> String {
    match key {
        Value::Null => "duplicate entry with null key".to_owned(),
        Value::Bool(b) => format!("duplicate entry with key `{b}`"),
        Value::Number(n) => format!("duplicate entry with key {n}"),
        Value::String(s) => format!("duplicate entry with key {s:?}"),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => {
            "duplicate entry in YAML map".to_owned()
        }
    }
}

/// Reads one value as [`Values`] does.
struct ValueSeed<V>(PhantomData<V>);

impl<'de, V: Values> DeserializeSeed<'de> for ValueSeed<V> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        V::value(d)
    }
}

/// What a top-level sequence's elements are.
#[derive(Clone, Copy)]
pub(super) enum Element {
    /// An item of a `kind: List`: a document of its own.
    Item,
    /// A service of a `kind: Inventory`.
    Service,
}

enum Sequence {
    Converted(Converted),
    /// Not a sequence: kept as it is, for the document's own checks to report.
    Other(Value),
}

struct SequenceSeed<'a, V> {
    doc: DocRef<'a>,
    element: Element,
    values: PhantomData<V>,
}

impl<'de, V: Values> DeserializeSeed<'de> for SequenceSeed<'_, V> {
    type Value = Sequence;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Sequence, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, V: Values> Visitor<'de> for SequenceSeed<'_, V> {
    type Value = Sequence;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Sequence, A::Error> {
        let mut converted = Converted::default();
        let mut index = 0;
        while let Some(value) = seq.next_element_seed(ValueSeed::<V>(PhantomData))? {
            // After the first error the rest is still read (a syntax error later in the file
            // is reported first, as before) but not converted.
            if converted.error.is_none() {
                converted.error = convert_element(
                    self.doc,
                    self.element,
                    index,
                    value,
                    &mut converted.services,
                );
            }
            index += 1;
        }
        Ok(Sequence::Converted(converted))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Sequence, A::Error> {
        Ok(Sequence::Other(V::value(MapAccessDeserializer::new(map))?))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Sequence, A::Error> {
        Ok(Sequence::Other(V::value(EnumAccessDeserializer::new(
            data,
        ))?))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Sequence, E> {
        Ok(Sequence::Other(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<Sequence, E> {
        Ok(Sequence::Other(Value::Null))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Sequence, E> {
        other(v.into_deserializer())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Sequence, E> {
        other(v.into_deserializer())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Sequence, E> {
        other(v.into_deserializer())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Sequence, E> {
        other(v.into_deserializer())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Sequence, E> {
        other(v.into_deserializer())
    }
}

fn other<'de, D: Deserializer<'de>>(d: D) -> Result<Sequence, D::Error> {
    Ok(Sequence::Other(Value::deserialize(d)?))
}

/// Converts one element into `out`; its error (and name) if it has one.
pub(super) fn convert_element(
    doc: DocRef<'_>,
    element: Element,
    index: usize,
    value: Value,
    out: &mut Vec<Service>,
) -> Option<(ConvertError, Option<String>)> {
    match element {
        Element::Item => {
            let item = DocRef {
                item: Some(index),
                ..doc
            };
            convert_document(item, value, out).err().map(|e| (e, None))
        }
        Element::Service => {
            let name = str_field(&value, &["name"]).map(str::to_owned);
            match inventory_service(doc, None, index, value) {
                Ok(service) => {
                    out.push(service);
                    None
                }
                Err(e) => Some((e, name)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mcp_core::model::ServiceKey;

    use crate::convert::test_support::err;
    use crate::convert::{parse, Format};

    /// `namespace` after `services` (keys sorted, as many exporters write them): the services
    /// converted before it was read get it, in their key and their origin.
    #[test]
    fn namespace_after_services_still_applies() {
        let yaml = "kind: Inventory\nservices:\n  - name: a\n  - name: b\nnamespace: shop\n";
        let json = r#"{"services": [{"name": "a"}, {"name": "b"}], "namespace": "shop", "kind": "Inventory"}"#;
        for (text, format) in [(yaml, Format::Yaml), (json, Format::Json)] {
            let services = parse("inv", text, format).expect("parses");
            let keys: Vec<_> = services.iter().map(|s| s.key.clone()).collect();
            assert_eq!(
                keys,
                vec![
                    ServiceKey::namespaced("shop", "a"),
                    ServiceKey::namespaced("shop", "b")
                ]
            );
            assert_eq!(
                services[1].origin,
                "file inv, document 1 (Inventory shop/b)"
            );
        }
    }

    /// A service's error names it with the namespace that came after it.
    #[test]
    fn error_before_the_namespace_names_it() {
        let yaml = "kind: Inventory\nservices:\n  - name: a\n  - name: b\n    ports: {http: x}\nnamespace: shop\n";
        let e = err("inv.yaml", yaml, Format::Yaml);
        assert_eq!(
            e,
            "file inv.yaml, document 1 (Inventory shop/b): services[1].ports.http: invalid \
             type: string \"x\", expected u32"
        );
    }

    /// kubectl writes `items` before `kind`: the items are converted as read, and kept only
    /// because the document is a List.
    #[test]
    fn items_before_kind() {
        let json = r#"{"apiVersion": "v1", "items": [
            {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
             "metadata": {"name": "a"}, "spec": {"hosts": ["a.example.com"]}}
        ], "kind": "List", "metadata": {"resourceVersion": ""}}"#;
        let services = parse("l.json", json, Format::Json).expect("parses");
        assert_eq!(services.len(), 1);
        assert_eq!(
            services[0].origin,
            "file l.json, document 1, items[0] (ServiceEntry a)"
        );
        // Not a List after all: the document's own error, not the items'.
        let e = err(
            "l.json",
            &json.replace("\"List\"", "\"Inventory\""),
            Format::Json,
        );
        assert!(
            e.contains("file l.json, document 1: items: unknown field `items`"),
            "{e}"
        );
        let e = err(
            "l.json",
            &json.replace("\"kind\": \"List\", ", ""),
            Format::Json,
        );
        assert!(
            e.contains("file l.json, document 1: kind: missing field `kind`"),
            "{e}"
        );
    }

    /// The document's own fields are checked before its services, as before.
    #[test]
    fn document_errors_come_before_service_errors() {
        let yaml =
            "kind: Inventory\nservices:\n  - name: a\n    bad: 1\napiVersion: mcp-adapter/v9\n";
        let e = err("inv.yaml", yaml, Format::Yaml);
        assert!(e.contains("unsupported apiVersion `mcp-adapter/v9`"), "{e}");
        let yaml = "kind: Inventory\nservices:\n  - name: a\n    bad: 1\nextra: 1\n";
        let e = err("inv.yaml", yaml, Format::Yaml);
        assert!(e.contains("unknown field `extra`"), "{e}");
    }

    /// A syntax error anywhere wins over a conversion error before it; the first conversion
    /// error wins over later ones, across documents too.
    #[test]
    fn error_precedence_is_the_whole_files() {
        let yaml = "kind: Inventory\nservices:\n  - name: a\n    bad: 1\n---\nkind: [unclosed\n";
        let e = err("p.yaml", yaml, Format::Yaml);
        assert!(
            e.contains("file p.yaml, document 2: YAML syntax error"),
            "{e}"
        );
        let json = r#"{"kind": "Inventory", "services": [{"name": "a", "bad": 1}, {"name": "#;
        let e = err("p.json", json, Format::Json);
        assert!(e.contains("file p.json: JSON syntax error"), "{e}");
        let yaml = "kind: Inventory\nservices:\n  - name: a\n    bad: 1\n  - name: b\n    worse: 2\n---\nkind: Deployment\n";
        let e = err("p.yaml", yaml, Format::Yaml);
        assert!(
            e.contains("(Inventory a): services[0].bad: unknown field `bad`"),
            "{e}"
        );
    }

    /// `services` that is not a sequence is reported by the document's check; null means none.
    #[test]
    fn services_not_a_sequence() {
        let e = err(
            "s.yaml",
            "kind: Inventory\nservices: {a: 1}\n",
            Format::Yaml,
        );
        assert!(
            e.contains("services: invalid type: map, expected a sequence"),
            "{e}"
        );
        let e = err("s.yaml", "kind: Inventory\nservices: 7\n", Format::Yaml);
        assert!(
            e.contains("services: invalid type: integer `7`, expected a sequence"),
            "{e}"
        );
        let none = parse("s.yaml", "kind: Inventory\nservices:\n", Format::Yaml).expect("parses");
        assert!(none.is_empty());
    }

    /// A key given twice: an error in YAML (as the parser's own mappings), the last one in JSON.
    #[test]
    fn duplicate_top_level_keys() {
        let yaml = "kind: Inventory\nnamespace: a\nnamespace: b\n";
        let e = err("d.yaml", yaml, Format::Yaml);
        assert!(
            e.contains("YAML syntax error: duplicate entry with key \"namespace\""),
            "{e}"
        );
        let json = r#"{"kind": "Inventory", "namespace": "a", "namespace": "b", "services": [{"name": "x"}]}"#;
        let services = parse("d.json", json, Format::Json).expect("parses");
        assert_eq!(services[0].key, ServiceKey::namespaced("b", "x"));
    }

    /// A document that is not a mapping is still refused by name, and a scalar `kind` of another
    /// type too.
    #[test]
    fn documents_that_are_not_mappings() {
        let e = err("n.yaml", "[1, 2]\n", Format::Yaml);
        assert!(e.contains("expected a mapping with `kind`"), "{e}");
        let e = err("n.json", "\"text\"", Format::Json);
        assert!(e.contains("expected a mapping with `kind`"), "{e}");
        assert!(parse("n.json", "null", Format::Json)
            .expect("parses")
            .is_empty());
    }
}
