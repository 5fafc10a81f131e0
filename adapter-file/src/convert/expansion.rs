//! A bound on what YAML aliases expand a file to.
//!
//! The YAML parser refuses the classic billion laughs (it counts alias jumps against the number
//! of events), but not a few thousand aliases of one large anchored node: each jump is cheap to
//! count and copies the whole node, so a 20 KB file can expand to millions of values and a
//! `--max-file-size` file to billions. So a file that has aliases is first walked as it expands,
//! counting values without keeping any, and refused once the count passes its budget.

use std::cell::Cell;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};

/// The least budget: a million values, far beyond any inventory written by hand.
const MIN_BUDGET: usize = 1_000_000;

/// The values a file of this text may expand to: as many as it has bytes (without aliases a
/// file always has fewer values than bytes), and at least [`MIN_BUDGET`].
pub(super) fn budget(text: &str) -> usize {
    text.len().max(MIN_BUDGET)
}

/// Can this text expand? Aliases start with `*` (a `*` in a quoted string costs only the
/// count).
pub(super) fn may_expand(text: &str) -> bool {
    text.contains('*')
}

/// Counts the values of one document, aliases expanded, against a budget shared by the file's
/// documents.
#[derive(Clone, Copy)]
pub(super) struct Counter<'a> {
    left: &'a Cell<usize>,
    budget: usize,
}

impl<'a> Counter<'a> {
    /// A counter drawing on `left`, which started at `budget`.
    pub(super) fn new(left: &'a Cell<usize>, budget: usize) -> Self {
        Self { left, budget }
    }

    fn take<E: de::Error>(self) -> Result<(), E> {
        match self.left.get().checked_sub(1) {
            Some(n) => {
                self.left.set(n);
                Ok(())
            }
            None => Err(E::custom(format!(
                "aliases expand the file to more than {} values (the limit is the file's size \
                 in bytes, at least {MIN_BUDGET}); refusing what looks like an alias bomb",
                self.budget
            ))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Counter<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.take()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.take()
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.take()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.take()
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.take()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.take()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.take()
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<(), E> {
        self.take()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.take()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.take()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.take()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.take()?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }

    /// A tagged value (`!custom x`): the tag, then what it tags.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        self.take()?;
        let (IgnoredAny, value) = data.variant()?;
        value.newtype_variant_seed(self)
    }
}
