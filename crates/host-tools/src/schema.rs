//! The subset of JSON Schema a tool's arguments are checked against.
//!
//! A schema is compiled once, at registration: a keyword this module cannot enforce is refused
//! there ([`SchemaError`]), so a tool is never served with a check weaker than its author wrote.
//! Supported: `type` (a name or a list), `properties`, `required`, `additionalProperties`
//! (`false`, `true` or a schema), `items`, `enum`, `const`, `minLength`/`maxLength` (counted in
//! characters), `minimum`/`maximum`, `minItems`/`maxItems`; `title`, `description`, `default`,
//! `examples` and `$schema` are read as documentation.

use std::collections::BTreeMap;

use serde_json::Value;

/// The deepest nesting of arguments checked; deeper arguments are refused, not recursed into.
pub const MAX_DEPTH: usize = 64;

/// A schema this module refuses to compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported schema at {path}: {reason}")]
pub struct SchemaError {
    /// Where in the schema (a JSON pointer).
    pub path: String,
    /// Why.
    pub reason: String,
}

/// Why arguments fail a schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("arguments at {}: {reason}", shown(.path))]
pub struct Violation {
    /// Where in the arguments (a JSON pointer; empty for the whole).
    pub path: String,
    /// Why.
    pub reason: String,
}

#[cold]
fn schema_error(path: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError {
        path: if path.is_empty() {
            "/".to_owned()
        } else {
            path.to_owned()
        },
        reason: reason.into(),
    }
}

/// A pointer as a person reads it: the whole document is `/`.
fn shown(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

#[cold]
fn violation(path: &str, reason: impl Into<String>) -> Violation {
    Violation {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Null,
    Boolean,
    Integer,
    Number,
    String,
    Array,
    Object,
}

impl Type {
    fn named(name: &str) -> Option<Type> {
        Some(match name {
            "null" => Type::Null,
            "boolean" => Type::Boolean,
            "integer" => Type::Integer,
            "number" => Type::Number,
            "string" => Type::String,
            "array" => Type::Array,
            "object" => Type::Object,
            _ => return None,
        })
    }

    fn admits(self, value: &Value) -> bool {
        match self {
            Type::Null => value.is_null(),
            Type::Boolean => value.is_boolean(),
            Type::Integer => value.is_i64() || value.is_u64(),
            Type::Number => value.is_number(),
            Type::String => value.is_string(),
            Type::Array => value.is_array(),
            Type::Object => value.is_object(),
        }
    }
}

#[derive(Debug, Clone)]
enum Additional {
    Allowed,
    Refused,
    Checked(Box<Schema>),
}

/// A compiled schema.
#[derive(Debug, Clone)]
pub struct Schema {
    types: Option<Vec<Type>>,
    properties: BTreeMap<String, Schema>,
    required: Vec<String>,
    additional: Additional,
    items: Option<Box<Schema>>,
    choices: Option<Vec<Value>>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
}

const DOCUMENTATION: [&str; 5] = ["title", "description", "default", "examples", "$schema"];

impl Schema {
    /// Compiles `schema`.
    ///
    /// # Errors
    /// [`SchemaError`] for anything but an object of the supported keywords with well-formed
    /// values.
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        compile_at(schema, "", 0)
    }

    /// Checks `value` against the schema.
    ///
    /// # Errors
    /// The first [`Violation`] found.
    pub fn check(&self, value: &Value) -> Result<(), Violation> {
        self.check_at(value, &mut String::new(), 0)
    }

    fn check_at(&self, value: &Value, path: &mut String, depth: usize) -> Result<(), Violation> {
        if depth > MAX_DEPTH {
            return Err(violation(path, format!("nested deeper than {MAX_DEPTH}")));
        }
        if let Some(types) = &self.types {
            if !types.iter().any(|kind| kind.admits(value)) {
                return Err(violation(path, format!("not of type {types:?}")));
            }
        }
        if let Some(choices) = &self.choices {
            if !choices.contains(value) {
                return Err(violation(path, "not one of the allowed values"));
            }
        }
        match value {
            Value::String(text) => {
                let characters = text.chars().count() as u64;
                if self.min_length.is_some_and(|min| characters < min) {
                    return Err(violation(path, "shorter than minLength"));
                }
                if self.max_length.is_some_and(|max| characters > max) {
                    return Err(violation(path, "longer than maxLength"));
                }
            }
            Value::Number(number) => {
                // JSON has no NaN: every number converts (large integers rounded).
                let number = number.as_f64().unwrap_or(0.0);
                if self.minimum.is_some_and(|min| number < min) {
                    return Err(violation(path, "below minimum"));
                }
                if self.maximum.is_some_and(|max| number > max) {
                    return Err(violation(path, "above maximum"));
                }
            }
            Value::Array(items) => {
                let count = items.len() as u64;
                if self.min_items.is_some_and(|min| count < min) {
                    return Err(violation(path, "fewer items than minItems"));
                }
                if self.max_items.is_some_and(|max| count > max) {
                    return Err(violation(path, "more items than maxItems"));
                }
                if let Some(schema) = &self.items {
                    for (index, item) in items.iter().enumerate() {
                        let length = path.len();
                        path.push_str(&format!("/{index}"));
                        schema.check_at(item, path, depth + 1)?;
                        path.truncate(length);
                    }
                }
            }
            Value::Object(object) => {
                for name in &self.required {
                    if !object.contains_key(name) {
                        return Err(violation(path, format!("missing required {name:?}")));
                    }
                }
                for (name, item) in object {
                    let length = path.len();
                    path.push('/');
                    path.push_str(&name.replace('~', "~0").replace('/', "~1"));
                    match (self.properties.get(name), &self.additional) {
                        (Some(schema), _) => schema.check_at(item, path, depth + 1)?,
                        (None, Additional::Checked(schema)) => {
                            schema.check_at(item, path, depth + 1)?;
                        }
                        (None, Additional::Refused) => {
                            return Err(violation(path, "not an allowed property"));
                        }
                        (None, Additional::Allowed) => {
                            if nesting(item) + depth > MAX_DEPTH {
                                return Err(violation(
                                    path,
                                    format!("nested deeper than {MAX_DEPTH}"),
                                ));
                            }
                        }
                    }
                    path.truncate(length);
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
        Ok(())
    }
}

/// How deep a value nests, stopping just past the bound.
fn nesting(value: &Value) -> usize {
    fn walk(value: &Value, depth: usize) -> usize {
        if depth > MAX_DEPTH {
            return depth;
        }
        match value {
            Value::Array(items) => items
                .iter()
                .map(|item| walk(item, depth + 1))
                .max()
                .unwrap_or(depth),
            Value::Object(object) => object
                .values()
                .map(|item| walk(item, depth + 1))
                .max()
                .unwrap_or(depth),
            _ => depth,
        }
    }
    walk(value, 0)
}

fn compile_at(schema: &Value, path: &str, depth: usize) -> Result<Schema, SchemaError> {
    if depth > MAX_DEPTH {
        return Err(schema_error(
            path,
            format!("nested deeper than {MAX_DEPTH}"),
        ));
    }
    let Value::Object(object) = schema else {
        return Err(schema_error(path, "a schema is a JSON object"));
    };
    let mut compiled = Schema {
        types: None,
        properties: BTreeMap::new(),
        required: Vec::new(),
        additional: Additional::Allowed,
        items: None,
        choices: None,
        min_length: None,
        max_length: None,
        minimum: None,
        maximum: None,
        min_items: None,
        max_items: None,
    };
    for (keyword, value) in object {
        let here = format!("{path}/{keyword}");
        match keyword.as_str() {
            "type" => {
                let names: Vec<&Value> = match value {
                    Value::Array(names) if !names.is_empty() => names.iter().collect(),
                    Value::String(_) => vec![value],
                    _ => return Err(schema_error(&here, "a type name or a non-empty list")),
                };
                let mut types = Vec::new();
                for name in names {
                    let kind = name
                        .as_str()
                        .and_then(Type::named)
                        .ok_or_else(|| schema_error(&here, format!("unknown type {name}")))?;
                    types.push(kind);
                }
                compiled.types = Some(types);
            }
            "properties" => {
                let Value::Object(properties) = value else {
                    return Err(schema_error(&here, "an object of schemas"));
                };
                for (name, property) in properties {
                    let property_path = format!("{here}/{name}");
                    compiled.properties.insert(
                        name.clone(),
                        compile_at(property, &property_path, depth + 1)?,
                    );
                }
            }
            "required" => {
                let Value::Array(names) = value else {
                    return Err(schema_error(&here, "a list of names"));
                };
                for name in names {
                    let name = name
                        .as_str()
                        .ok_or_else(|| schema_error(&here, "a list of names"))?;
                    compiled.required.push(name.to_owned());
                }
            }
            "additionalProperties" => {
                compiled.additional = match value {
                    Value::Bool(true) => Additional::Allowed,
                    Value::Bool(false) => Additional::Refused,
                    schema => Additional::Checked(Box::new(compile_at(schema, &here, depth + 1)?)),
                };
            }
            "items" => compiled.items = Some(Box::new(compile_at(value, &here, depth + 1)?)),
            "enum" => {
                let Value::Array(choices) = value else {
                    return Err(schema_error(&here, "a list of values"));
                };
                compiled.choices = Some(choices.clone());
            }
            "const" => compiled.choices = Some(vec![value.clone()]),
            "minLength" => compiled.min_length = Some(count(value, &here)?),
            "maxLength" => compiled.max_length = Some(count(value, &here)?),
            "minItems" => compiled.min_items = Some(count(value, &here)?),
            "maxItems" => compiled.max_items = Some(count(value, &here)?),
            "minimum" => compiled.minimum = Some(number(value, &here)?),
            "maximum" => compiled.maximum = Some(number(value, &here)?),
            keyword if DOCUMENTATION.contains(&keyword) => {}
            other => {
                return Err(schema_error(
                    &here,
                    format!("keyword {other:?} is not enforced here"),
                ))
            }
        }
    }
    Ok(compiled)
}

fn count(value: &Value, path: &str) -> Result<u64, SchemaError> {
    value
        .as_u64()
        .ok_or_else(|| schema_error(path, "a non-negative integer"))
}

fn number(value: &Value, path: &str) -> Result<f64, SchemaError> {
    value
        .as_f64()
        .filter(|number| number.is_finite())
        .ok_or_else(|| schema_error(path, "a finite number"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object_schema() -> Schema {
        Schema::compile(&json!({
            "type": "object",
            "description": "documentation is read and ignored",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 3},
                "count": {"type": "integer", "minimum": 0, "maximum": 10},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                "mode": {"const": "fast"},
                "maybe": {"type": ["string", "null"]}
            },
            "required": ["name"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn valid_arguments_pass() {
        let schema = object_schema();
        for arguments in [
            json!({"name": "abc"}),
            json!({"name": "é😀x", "count": 10, "tags": ["a", "b"], "mode": "fast", "maybe": null}),
            json!({"name": "a", "count": 0, "maybe": "x"}),
        ] {
            schema.check(&arguments).unwrap();
        }
    }

    #[test]
    fn each_violation_names_its_place() {
        let schema = object_schema();
        for (arguments, path, reason) in [
            (json!([]), "", "not of type"),
            (json!({}), "", "missing required \"name\""),
            (json!({"name": ""}), "/name", "shorter"),
            (json!({"name": "abcd"}), "/name", "longer"),
            (json!({"name": "a", "count": -1}), "/count", "below"),
            (json!({"name": "a", "count": 11}), "/count", "above"),
            (json!({"name": "a", "count": 1.5}), "/count", "not of type"),
            (
                json!({"name": "a", "tags": ["c"]}),
                "/tags/0",
                "allowed values",
            ),
            (
                json!({"name": "a", "tags": ["a", "a", "a"]}),
                "/tags",
                "maxItems",
            ),
            (
                json!({"name": "a", "mode": "slow"}),
                "/mode",
                "allowed values",
            ),
            (json!({"name": "a", "maybe": 1}), "/maybe", "not of type"),
            (
                json!({"name": "a", "x/y": 1}),
                "/x~1y",
                "not an allowed property",
            ),
        ] {
            let error = schema.check(&arguments).unwrap_err();
            assert_eq!(error.path, path, "{arguments}");
            assert!(error.reason.contains(reason), "{arguments}: {error}");
            let shown = if path.is_empty() { "/" } else { path };
            assert!(error
                .to_string()
                .starts_with(&format!("arguments at {shown}: ")));
        }
    }

    #[test]
    fn unenforceable_keywords_are_refused_at_compile() {
        for (schema, path) in [
            (json!({"pattern": "^a"}), "/pattern"),
            (
                json!({"properties": {"a": {"oneOf": []}}}),
                "/properties/a/oneOf",
            ),
            (json!({"type": "text"}), "/type"),
            (json!({"type": []}), "/type"),
            (json!({"minLength": -1}), "/minLength"),
            (json!({"maximum": "3"}), "/maximum"),
            (json!({"required": [1]}), "/required"),
            (json!(true), "/"),
        ] {
            let error = Schema::compile(&schema).unwrap_err();
            assert_eq!(error.path, path, "{schema}");
        }
    }

    #[test]
    fn additional_properties_may_be_checked_by_a_schema() {
        let schema =
            Schema::compile(&json!({"additionalProperties": {"type": "integer"}})).unwrap();
        schema.check(&json!({"a": 1, "b": 2})).unwrap();
        assert_eq!(schema.check(&json!({"a": "x"})).unwrap_err().path, "/a");
    }

    #[test]
    fn nesting_past_the_bound_is_refused_even_where_unchecked() {
        let mut deep = json!(1);
        for _ in 0..=MAX_DEPTH + 1 {
            deep = json!([deep]);
        }
        let open = Schema::compile(&json!({})).unwrap();
        assert!(open.check(&json!({"a": deep.clone()})).is_err());
        let items = Schema::compile(&json!({"items": {"items": {}}})).unwrap();
        assert!(items.check(&json!([[1]])).is_ok());
        let mut recursive = json!({});
        for _ in 0..=MAX_DEPTH {
            recursive = json!({"items": recursive});
        }
        assert!(Schema::compile(&recursive)
            .unwrap_err()
            .reason
            .contains("deeper"));
    }
}
