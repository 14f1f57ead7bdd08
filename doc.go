// Package oncemill holds what every part of oncemill shares: the error of a
// configuration that cannot work. Users start at package receiver.
//
// Every constructor and Build report a bad setting as a *ConfigError that
// wraps ErrInvalidConfig:
//
//	oncemill: invalid configuration: WithPolicy(Policy.Heartbeat): 40s is not shorter than LeaseDuration 30s, so the lease would expire between beats; ...
package oncemill
