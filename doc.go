// Package oncemill holds what every part of oncemill shares: the error of a
// configuration that cannot work. Users start at package receiver.
//
// Every constructor, Build and Validate reports a bad setting as a
// *ConfigError that wraps ErrInvalidConfig:
//
//	oncemill: invalid configuration: policy.Heartbeat: 40s is not shorter than Lease 30s; ...
package oncemill
