//! JSON into a [`serde_json::Value`], refusing an object that names a key twice (issue 26 item
//! 12): `serde_json::Value` keeps the last of two equal keys silently, so a file could say one
//! thing to a reader that takes the first and another to us.
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A JSON value whose objects name each key once.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Strict::deserialize(d).map(|s| s.0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Strict(e)) = seq.next_element()? {
            v.push(e);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if m.contains_key(&k) {
                let shown = crate::analysis::input::quote_input(&k);
                return Err(de::Error::custom(format_args!(
                    "the key \"{shown}\" appears twice in one object"
                )));
            }
            let Strict(v) = map.next_value()?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

/// Parse `text` as one JSON value; an object naming a key twice is an error (a data error:
/// [`serde_json::Error::classify`] is `Data`), as is anything `serde_json::from_str` refuses.
pub fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<Strict>(text).map(|s| s.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let v = from_str(r#"{"a":[1,-2,2.5,"s",null,true,{"b":{}}]}"#).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a":[1,-2,2.5,"s",null,true,{"b":{}}]})
        );
        for text in [r#"{"a":1,"a":2}"#, r#"[{"x":{"u":"ms","u":"s"}}]"#] {
            let e = from_str(text).unwrap_err();
            assert_eq!(e.classify(), serde_json::error::Category::Data, "{text}");
            assert!(e.to_string().contains("appears twice in one object"), "{e}");
        }
    }

    /// The Cloud Monitoring reader (bucket, chart --cloud, compare --cloud, --layout-from)
    /// refuses a duplicate key in one sentence, in a whole document and in a JSON Lines file.
    #[test]
    fn the_cloud_reader_refuses_duplicate_keys() {
        let ok = r#"{"timeSeries":[],"unit":"ms"}"#;
        assert!(crate::analysis::cloud_monitoring::parse(ok, "c.json").is_ok());
        let e = crate::analysis::cloud_monitoring::parse(
            r#"{"timeSeries":[],"unit":"ms","unit":"s"}"#,
            "c.json",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "c.json is not a Cloud Monitoring file: the key \"unit\" appears twice in one object at line 1 column 35"
        );
        let e = crate::analysis::cloud_monitoring::parse(
            &format!("{ok}\n{{\"timeSeries\":[],\"timeSeries\":[]}}\n"),
            "c.jsonl",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("c.jsonl line 2 is not a Cloud Monitoring request: the key \"timeSeries\" appears twice"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}
