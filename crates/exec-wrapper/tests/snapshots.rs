//! The guest-side scripts are security-relevant text: any change to them shows up here and must
//! be reviewed (the `.snap` files are committed).

use exec_wrapper::{DOCKER_WRAPPER, KILL_SCRIPT, SBX_WRAPPER, TOOL_PROBE_SCRIPT};

#[test]
fn docker_wrapper_script() {
    insta::assert_snapshot!("docker_wrapper", DOCKER_WRAPPER);
}

#[test]
fn sbx_wrapper_script() {
    insta::assert_snapshot!("sbx_wrapper", SBX_WRAPPER);
}

#[test]
fn kill_script() {
    insta::assert_snapshot!("kill_script", KILL_SCRIPT);
}

#[test]
fn tool_probe_script() {
    insta::assert_snapshot!("tool_probe_script", TOOL_PROBE_SCRIPT);
}
