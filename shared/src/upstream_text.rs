//! Upstream's `Assigned` condition messages for each event, which existing tooling matches
//! (cloud-network-config-controller, pkg/controller/cloudprivateipconfig/
//! cloudprivateipconfig_controller.go). The reconciler's messages start with them and put their
//! detail after; a front end reads them to tell a move's halfway point from a detach.

/// An attach is under way.
pub const ADDING: &str = "Adding IP address";
/// An attach is done.
pub const ADDED: &str = "IP address successfully added";
/// An attach failed (upstream: `"...request, err: %v"`).
pub const ADD_FAILED: &str = "Error processing cloud assignment request, err";
/// A move is under way.
pub const MOVING: &str = "Moving IP address";
/// A move is done.
pub const MOVED: &str = "IP address successfully moved";
/// A move failed.
pub const MOVE_FAILED: &str = "Error processing cloud move request, err";
/// A detach (release) is under way.
pub const DELETING: &str = "Deleting IP address";
/// A detach is done.
pub const DELETED: &str = "IP address successfully deleted";
/// A detach failed.
pub const DELETE_FAILED: &str = "Error processing cloud release request, err";
