//! The guest-side scripts are security-relevant text: any change to them shows up here and must
//! be reviewed (the `.snap` files are committed).

use exec_wrapper::scripts::{
    DOCKER_INIT_WRAPPER, DOCKER_WRAPPER, KILL_SCRIPT, NAMESPACE_KILL_SCRIPT, SBX_WRAPPER,
    TOOL_PROBE_SCRIPT, TREE_KILL_SCRIPT,
};

#[test]
fn docker_wrapper_script() {
    insta::assert_snapshot!("docker_wrapper", DOCKER_WRAPPER);
}

#[test]
fn docker_init_wrapper_script() {
    // One line: the tree kill reads the first line of the init's command line up to the nonce.
    assert!(!DOCKER_INIT_WRAPPER.contains('\n'));
    insta::assert_snapshot!("docker_init_wrapper", DOCKER_INIT_WRAPPER);
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
fn tree_kill_script() {
    insta::assert_snapshot!("tree_kill_script", TREE_KILL_SCRIPT);
}

#[test]
fn namespace_kill_script() {
    insta::assert_snapshot!("namespace_kill_script", NAMESPACE_KILL_SCRIPT);
}

#[test]
fn tool_probe_script() {
    insta::assert_snapshot!("tool_probe_script", TOOL_PROBE_SCRIPT);
}
