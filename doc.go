// Package oncemill holds what every part of oncemill shares: the error of a
// configuration that cannot work. Users start at package receiver.
//
// Every constructor and Build report a bad setting as a
// *ConfigError that wraps ErrInvalidConfig, naming the setting and what to
// change. Build names the builder method and the field of its argument:
//
//	oncemill: invalid configuration: WithPolicy(Policy.Heartbeat): 40s is not shorter than LeaseDuration 30s, so the lease would expire between beats; use less than LeaseDuration, or leave it 0 for 10s (a third of LeaseDuration, room for two missed beats)
package oncemill
