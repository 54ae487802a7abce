//! Fuzz the schema subset: a schema compiled from arbitrary JSON, then arbitrary JSON checked
//! against it, as a host checks a guest's call arguments.
//!
//! Properties: nothing panics or overflows the stack, whatever the nesting; a schema either
//! compiles or is refused with a reason.
#![no_main]

use host_tools::schema::Schema;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&[u8], &[u8])| {
    let (schema, arguments) = input;
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(schema) else {
        return;
    };
    let Ok(schema) = Schema::compile(&schema) else {
        return;
    };
    let Ok(arguments) = serde_json::from_slice::<serde_json::Value>(arguments) else {
        return;
    };
    let _ = schema.check(&arguments);
});
