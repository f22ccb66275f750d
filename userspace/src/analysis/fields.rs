//! A TOML file read in parts, each part a struct that takes its own keys and ignores the others'
//! (observe's config file: observe's keys, each view's): the keys a derived `Deserialize` struct
//! accepts (serde's own list, [`serde_fields`]), name lists joined at compile time ([`concat`]),
//! and a part's error with the top-level key it is at ([`from_toml`]), so that of several parts'
//! errors the one a single struct would have met first can be told ([`first`]).
use std::cell::Cell;

use serde::de::Visitor;
use serde::de::{self, Deserialize, DeserializeOwned, DeserializeSeed, Deserializer, MapAccess};

/// The keys a struct with a derived `Deserialize` accepts, in declaration order: the `fields`
/// serde's derive hands to `deserialize_struct` (renames applied, `#[serde(skip)]` fields left
/// out). Not a struct (or a hand-written `Deserialize` that never asks for one): empty.
pub fn serde_fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldsOf(&mut fields));
    fields
}

/// A deserializer that only records the fields of the struct asked of it, then fails.
struct FieldsOf<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldsOf<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// A part's error reading a TOML file ([`from_toml`]).
#[derive(Debug)]
pub struct PartError {
    /// Which top-level key it is at, in the order toml hands the keys over (1 for the first; 0:
    /// before any, e.g. the text is not TOML).
    pub key: usize,
    pub error: toml::de::Error,
}

/// `T` from TOML text, as `toml::from_str` reads it (the same spans and messages); an error with
/// the top-level key it is at ([`PartError::key`]).
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, PartError> {
    let keys = Cell::new(0);
    let d = Counted {
        inner: toml::Deserializer::new(text),
        keys: &keys,
    };
    T::deserialize(d).map_err(|error| PartError {
        key: keys.get(),
        error,
    })
}

/// Of several parts' errors the one a single struct taking every part's keys would have met
/// first: the one at the earliest top-level key (the same key: the first given).
pub fn first(errors: impl IntoIterator<Item = PartError>) -> Option<PartError> {
    errors.into_iter().min_by_key(|e| e.key)
}

/// [`from_toml`]'s deserializer: toml's, counting the keys of the top-level table handed over.
struct Counted<'a, D> {
    inner: D,
    keys: &'a Cell<usize>,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Counted<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        let keys = self.keys;
        self.inner
            .deserialize_any(CountedVisitor { inner: v, keys })
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        let keys = self.keys;
        self.inner
            .deserialize_map(CountedVisitor { inner: v, keys })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        let keys = self.keys;
        (self.inner).deserialize_struct(name, fields, CountedVisitor { inner: v, keys })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct enum identifier ignored_any
    }
}

/// [`Counted`]'s visitor: the top-level table's keys go through [`CountedMap`].
struct CountedVisitor<'a, V> {
    inner: V,
    keys: &'a Cell<usize>,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for CountedVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let keys = self.keys;
        self.inner.visit_map(CountedMap { inner: map, keys })
    }
}

/// The top-level table, counting the keys asked for.
struct CountedMap<'a, A> {
    inner: A,
    keys: &'a Cell<usize>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for CountedMap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        k: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.keys.set(self.keys.get() + 1);
        self.inner.next_key_seed(k)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, v: V) -> Result<V::Value, A::Error> {
        self.inner.next_value_seed(v)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// The name lists `parts`, one after the other, as one array (of length `N`, their total; a
/// wrong `N` fails the build). For `const` lists made of other `const` lists.
pub const fn concat<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut at) = (0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            out[at] = parts[i][j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(at == N, "concat: N is not the parts' total length");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_structs_fields_in_order_renamed_without_skipped() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct S {
            b: u8,
            #[serde(rename = "x")]
            a: u8,
            #[serde(skip)]
            s: u8,
            c: Option<String>,
        }
        assert_eq!(serde_fields::<S>(), ["b", "x", "c"]);
        assert!(serde_fields::<u32>().is_empty());
        assert!(serde_fields::<std::collections::BTreeMap<String, u8>>().is_empty());
    }

    /// toml's error (the same message and span), at the top-level key in toml's order, which is
    /// not always the file's; of several, the first at the earliest key.
    #[test]
    fn a_parts_error_is_at_its_top_level_key() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct P {
            a: Option<u8>,
            c: Option<u8>,
        }
        let e = from_toml::<P>("a = 1\nb = 2\nc = \"x\"\n").unwrap_err();
        assert_eq!(e.key, 3);
        assert_eq!(e.error.message(), "invalid type: string \"x\", expected u8");
        assert_eq!(e.error.span().map(|s| s.start), Some(16));
        assert_eq!(from_toml::<P>("a = \n").unwrap_err().key, 0, "not TOML");
        let t = "[c.q]\n[a]\n[c]\n";
        let (e, a) = (
            from_toml::<P>(t).unwrap_err(),
            toml::from_str::<P>(t).unwrap_err(),
        );
        // `c` is first in the file, but toml hands `a` over first (a table made by a dotted
        // header goes after one with its own): the first error toml meets is at `a`, line 2.
        assert_eq!((e.key, e.error.message()), (1, a.message()), "{a}");
        assert_eq!(e.error.span(), a.span());
        assert_eq!(a.span().map(|s| s.start), Some(6));
        let e = first([
            PartError {
                key: 2,
                error: toml::from_str::<P>("a = \"1\"").unwrap_err(),
            },
            PartError {
                key: 1,
                error: toml::from_str::<P>("c = \"2\"").unwrap_err(),
            },
            PartError {
                key: 1,
                error: toml::from_str::<P>("a = \"3\"").unwrap_err(),
            },
        ]);
        assert!(e.unwrap().error.message().contains("\"2\""));
    }

    #[test]
    fn concat_joins_in_order() {
        const A: &[&str] = &["a", "b"];
        const B: &[&str] = &[];
        const C: &[&str] = &["c"];
        const ALL: &[&str] = &concat::<{ A.len() + B.len() + C.len() }>(&[A, B, C]);
        assert_eq!(ALL, ["a", "b", "c"]);
    }
}
