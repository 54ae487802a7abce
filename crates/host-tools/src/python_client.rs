//! The Python module a run's program imports: one function per declared tool, generated from
//! the tools' schemas, calling through the relay's socket with the frames of [`crate::frame`].
//! No I/O: the program channel writes the text into the run directory.
//!
//! A tool whose schema is an object of named properties gets a function with those names as
//! parameters (the required ones first, the others keyword-only and left out of the call when
//! not given, and `**_extra` unless the schema closes the object); any other schema, or a
//! property name Python cannot spell, gets `(**arguments)`. Every name and text from the host
//! enters the module as a JSON string literal, which Python reads as the same string. The
//! module is a convenience for the program, not a control: the host checks every call.

use serde_json::Value;

use crate::dispatch::RunTools;

/// The module's name, as a program imports it.
pub const MODULE_NAME: &str = "host_tools";

/// The module's file name in the run directory.
pub const MODULE_FILE: &str = "host_tools.py";

/// The client every generated module starts with.
const CLIENT: &str = include_str!("python/client.py");

/// The names the client defines, which no generated function may take.
const CLIENT_NAMES: [&str; 4] = ["call", "HostToolError", "MAX_FRAME", "TOOLS"];

/// Python's keywords (3.11 and later), which are never an identifier.
const KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// The module for `tools`, whose client refuses a frame past `max_frame` bytes of payload (the
/// run's [`RunBounds::max_frame_payload`](crate::RunBounds::max_frame_payload)).
pub fn python_module(tools: &RunTools, max_frame: usize) -> String {
    let mut module = CLIENT.replace("@MAX_FRAME@", &max_frame.to_string());
    let mut taken: Vec<String> = CLIENT_NAMES.iter().map(|name| (*name).to_owned()).collect();
    let mut table = Vec::new();
    for tool in tools.tools() {
        let function = function_name(tool.name(), &taken);
        taken.push(function.clone());
        let signature = Signature::of(tool.schema());
        let doc = if tool.description().is_empty() {
            format!("The host tool {}.", tool.name())
        } else {
            tool.description().to_owned()
        };
        let doc = format!("{doc}\n\nArguments (JSON Schema): {}", tool.schema());
        module.push_str(&format!(
            "\n\ndef {function}({}):\n    {}\n    return _call({}, {})\n",
            signature.parameters(),
            literal(&doc),
            literal(tool.name()),
            signature.arguments(),
        ));
        table.push(format!("    {}: {function},\n", literal(tool.name())));
    }
    module.push_str("\n\nTOOLS = {\n");
    for line in &table {
        module.push_str(line);
    }
    module.push_str("}\n");
    module
}

/// A Python string literal of `text`: JSON's escapes are Python's.
fn literal(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// Whether `name` may be a parameter: an ASCII identifier, not a keyword, and not starting with
/// `_` (the client's private names).
fn parameter_name(name: &str) -> bool {
    let mut characters = name.chars();
    characters
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic())
        && characters.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&name)
}

/// The tool's function name: its name with `.` and `-` as `_`, then `_` appended until it is
/// no keyword and no name already taken.
fn function_name(tool: &str, taken: &[String]) -> String {
    let mut name: String = tool
        .chars()
        .map(|c| if c == '.' || c == '-' { '_' } else { c })
        .collect();
    while KEYWORDS.contains(&name.as_str()) || taken.contains(&name) {
        name.push('_');
    }
    name
}

/// A generated function's parameters.
#[derive(Debug, PartialEq)]
enum Signature {
    /// `(**arguments)`: the schema names no properties Python can spell.
    Open,
    /// Named parameters.
    Named {
        required: Vec<String>,
        optional: Vec<String>,
        extra: bool,
    },
}

impl Signature {
    fn of(schema: &Value) -> Signature {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return Signature::Open;
        };
        if !properties.keys().all(|name| parameter_name(name)) {
            return Signature::Open;
        }
        let mut required = Vec::new();
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match name.as_str() {
                Some(name) if properties.contains_key(name) => {
                    if !required.iter().any(|other| other == name) {
                        required.push(name.to_owned());
                    }
                }
                // A required name without a property of its own: not spelled as parameters.
                _ => return Signature::Open,
            }
        }
        let optional = properties
            .keys()
            .filter(|name| !required.contains(name))
            .cloned()
            .collect();
        let extra = schema.get("additionalProperties") != Some(&Value::Bool(false));
        Signature::Named {
            required,
            optional,
            extra,
        }
    }

    fn parameters(&self) -> String {
        match self {
            Signature::Open => "**arguments".to_owned(),
            Signature::Named {
                required,
                optional,
                extra,
            } => {
                let mut parameters = required.clone();
                if !optional.is_empty() {
                    parameters.push("*".to_owned());
                    parameters.extend(optional.iter().map(|name| format!("{name}=_OMITTED")));
                }
                if *extra {
                    parameters.push("**_extra".to_owned());
                }
                parameters.join(", ")
            }
        }
    }

    fn arguments(&self) -> String {
        match self {
            Signature::Open => "arguments".to_owned(),
            Signature::Named {
                required,
                optional,
                extra,
            } => {
                let mut entries: Vec<String> = required
                    .iter()
                    .chain(optional)
                    .map(|name| format!("{}: {name}", literal(name)))
                    .collect();
                if *extra {
                    entries.push("**_extra".to_owned());
                }
                format!("_present({{{}}})", entries.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostTool, Registry};
    use serde_json::json;

    fn tools() -> RunTools {
        let mut registry = Registry::new();
        let schemas = [
            (
                "add",
                "adds two integers",
                json!({"type": "object",
                       "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                      "scale": {"type": "number"}},
                       "required": ["a", "b"], "additionalProperties": false}),
            ),
            (
                "echo",
                "",
                json!({"properties": {"text": {"type": "string"}}}),
            ),
            (
                "shadowing",
                "properties named as the client's public names",
                json!({"properties": {"call": {}, "extra": {}, "arguments": {}},
                       "required": ["call"]}),
            ),
            ("call", "shadows the client", json!({})),
            (
                "web.fetch-page",
                "a \"quoted\" \\ description\nover two lines",
                json!({"properties": {"class": {"type": "string"}}}),
            ),
            (
                "hidden",
                "a private-looking property",
                json!({"properties": {"_call": {"type": "string"}}}),
            ),
        ];
        for (name, description, schema) in schemas {
            registry
                .register(
                    HostTool::new(name, description, schema, |_| async { Ok(json!(null)) })
                        .unwrap(),
                )
                .unwrap();
        }
        registry.all_for_run()
    }

    #[test]
    fn the_module_is_the_client_and_one_function_per_tool() {
        insta::assert_snapshot!(python_module(&tools(), 70_000));
    }

    #[test]
    fn names_python_cannot_take_are_renamed_or_left_to_keyword_arguments() {
        assert_eq!(function_name("call", &["call".to_owned()]), "call_");
        assert_eq!(function_name("class", &[]), "class_");
        assert_eq!(function_name("a.b-c", &[]), "a_b_c");
        assert_eq!(
            function_name("a-b", &["a_b".to_owned(), "a_b_".to_owned()]),
            "a_b__"
        );
        for bad in ["class", "_call", "9a", "a-b", "", "ü"] {
            assert!(!parameter_name(bad), "{bad}");
        }
        assert!(parameter_name("text_2"));
        assert_eq!(
            Signature::of(&json!({"properties": {"a": {}}, "required": ["a", "b"]})),
            Signature::Open
        );
        assert_eq!(Signature::of(&json!({"type": "string"})), Signature::Open);
    }

    #[test]
    fn every_host_text_is_one_python_literal() {
        let module = python_module(&tools(), 1);
        assert!(module.contains(r#""a \"quoted\" \\ description\nover two lines"#));
        assert!(module.contains("MAX_FRAME = 1\n"));
        assert!(!module.contains("@MAX_FRAME@"));
    }
}
