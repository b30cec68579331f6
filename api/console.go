package api

import "time"

// HostInfo is the body of GET /v1/host: what the host holds and has left,
// and the templates new VMs are restored from.
type HostInfo struct {
	Accel string `json:"accel"`
	// MemoryTotalBytes and MemoryAvailableBytes are the host's (MemTotal,
	// MemAvailable); MemoryCommittedBytes is the memory of the VMs that hold
	// RAM (running, paused, creating): what admission has let in.
	MemoryTotalBytes     int64 `json:"memory_total_bytes"`
	MemoryAvailableBytes int64 `json:"memory_available_bytes"`
	MemoryCommittedBytes int64 `json:"memory_committed_bytes"`
	// DiskFreeBytes is the free space of the data dir's file system.
	DiskFreeBytes int64 `json:"disk_free_bytes"`
	// VMs counts VMs by state; Running and Suspended repeat two of them.
	VMs       map[State]int  `json:"vms"`
	Running   int            `json:"running"`
	Suspended int            `json:"suspended"`
	WarmPool  map[string]int `json:"warm_pool,omitempty"`
	Templates []Template     `json:"templates"`
}

// Template is a booted-once image frozen at its ready point, which creates
// of its shape restore.
type Template struct {
	Key        string    `json:"key"`
	ImageHash  string    `json:"image_hash"`
	CPUs       int       `json:"cpus"`
	MemoryMiB  int64     `json:"memory_mib"`
	DiskBytes  int64     `json:"disk_bytes"`
	Accel      string    `json:"accel"`
	QEMU       string    `json:"qemu_version"`
	Machine    string    `json:"machine"`
	ColdBootMs int64     `json:"cold_boot_ms"`
	CreatedAt  time.Time `json:"created_at"`
}

// VMMetrics is the body of GET /v1/vms/{id}/metrics: the last hour of a
// running VM's CPU and memory use, measured on its QEMU process.
type VMMetrics struct {
	VM          string         `json:"vm"`
	IntervalSec int            `json:"interval_s"`
	Samples     []MetricSample `json:"samples"`
}

// MetricSample is one measurement (see VMMetrics).
type MetricSample struct {
	Time time.Time `json:"time"`
	// CPUPercent is QEMU's CPU use over the interval before Time, in percent
	// of one host core.
	CPUPercent float64 `json:"cpu_percent"`
	// RSSBytes is QEMU's resident memory: the guest RAM the host holds.
	RSSBytes int64 `json:"rss_bytes"`
}
