//! Each view's statistics of one flow ([`Columns`]): one key per view in
//! the flow's object (`"tcp": {...}, "sampler": {...}`), in registry order,
//! whatever views are registered. Rows, `end` flows, tables and result
//! files read a view's column by its kind, never by a field named after it.
use std::borrow::Cow;

use schemars::JsonSchema;
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::analysis::view_kind::ViewKind;

/// One value per view, in registry order (serialised flattened into the
/// flow's object: each present view's name as a key).
#[derive(Debug, Clone, PartialEq)]
pub struct Columns<T>(Vec<(ViewKind, T)>);

impl<T> Default for Columns<T> {
    fn default() -> Self {
        Columns(Vec::new())
    }
}

impl<T> Columns<T> {
    /// A view's column, if it has one.
    pub fn get(&self, k: ViewKind) -> Option<&T> {
        self.0.iter().find(|(v, _)| *v == k).map(|(_, t)| t)
    }

    pub fn get_mut(&mut self, k: ViewKind) -> Option<&mut T> {
        self.0.iter_mut().find(|(v, _)| *v == k).map(|(_, t)| t)
    }

    pub fn has(&self, k: ViewKind) -> bool {
        self.get(k).is_some()
    }

    /// Set a view's column (kept in registry order).
    pub fn set(&mut self, k: ViewKind, t: T) {
        match self.0.binary_search_by_key(&k, |(v, _)| *v) {
            Ok(i) => self.0[i].1 = t,
            Err(i) => self.0.insert(i, (k, t)),
        }
    }

    /// With a view's column set (building a row).
    pub fn with(mut self, k: ViewKind, t: T) -> Self {
        self.set(k, t);
        self
    }

    /// Every present column, in registry order.
    pub fn iter(&self) -> impl Iterator<Item = (ViewKind, &T)> {
        self.0.iter().map(|(k, t)| (*k, t))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Serialize> Serialize for Columns<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, t) in &self.0 {
            m.serialize_entry(k.as_str(), t)?;
        }
        m.end()
    }
}

/// Reads the keys that name a view this build knows; any other key of the
/// flow's object (read into its own field, or unknown) is skipped here.
impl<'de, T: DeserializeOwned> Deserialize<'de> for Columns<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: DeserializeOwned> Visitor<'de> for V<T> {
            type Value = Columns<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a flow's per-view statistics")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Columns<T>, A::Error> {
                let mut c = Columns::default();
                while let Some(key) = a.next_key::<Cow<'de, str>>()? {
                    match ViewKind::from_name(&key) {
                        Some(k) => {
                            if let Some(t) = a.next_value::<Option<T>>()? {
                                c.set(k, t);
                            }
                        }
                        None => {
                            a.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(c)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Every registered view as an optional property of the flow's object.
impl<T: JsonSchema> JsonSchema for Columns<T> {
    fn schema_name() -> Cow<'static, str> {
        Cow::Owned(format!("Columns_of_{}", T::schema_name()))
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(gen: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut props = serde_json::Map::new();
        for k in ViewKind::ALL {
            let sub = gen.subschema_for::<Option<T>>();
            props.insert(k.as_str().to_string(), sub.to_value());
        }
        schemars::json_schema!({"type": "object", "properties": props})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Row {
        a: u32,
        #[serde(flatten)]
        views: Columns<u32>,
        z: u32,
    }

    #[test]
    fn columns_in_registry_order_flattened_and_read_back() {
        let mut views = Columns::default();
        views.set(ViewKind::Sampler, 2);
        views.set(ViewKind::Tcp, 1);
        let r = Row { a: 0, views, z: 9 };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"a":0,"tcp":1,"sampler":2,"z":9}"#);
        assert_eq!(serde_json::from_str::<Row>(&s).unwrap(), r);
        // unknown keys and null columns are skipped
        let r: Row =
            serde_json::from_str(r#"{"a":0,"other":[1],"tcp":null,"sampler":5,"z":1}"#).unwrap();
        assert_eq!(
            r.views.iter().collect::<Vec<_>>(),
            vec![(ViewKind::Sampler, &5)]
        );
    }
}
