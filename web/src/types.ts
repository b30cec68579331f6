export interface Port { port: number; kind: string; public?: boolean; url?: string; host?: string; created_at: string }
export interface VM {
  id: string; name: string; state: string; cpus: number; memory_mib: number; disk_bytes: number;
  labels?: Record<string, string>; ip?: string; created_at: string; image?: string; source?: string;
  network?: string; ports?: Port[]; error?: string; next_cpus?: number; next_memory_mib?: number;
}
export interface AgentEvent { seq: number; vm: string; time: string; type: string; actor: string; message: string; data?: Record<string, string> }
export interface Snapshot { id: string; name: string; vm_id: string; vm_name: string; cpus: number; memory_mib: number; disk_bytes: number; state_bytes: number; created_at: string; image: string }
export interface NetworkInfo { name: string; vms: string[]; created_at: string }
export interface Token { id: string; token?: string; vm_id: string; allow: string[]; user?: string; name?: string; created_at: string; expires_at: string }
export interface FileInfo { name: string; path: string; type: string; size: number; mode: number; owner?: string; mtime: string; link_target?: string }
export interface TermInfo { name: string; pid: number; user: string; argv: string[]; clients: number; exited: boolean; created_at: string }
export interface ServiceInfo { name: string; active_state: string; sub_state: string; main_pid: number; restarts: number; restart: string; argv: string[]; user: string }
export interface MetricSample { time: string; cpu_percent: number; rss_bytes: number }
export interface Template { key: string; image_hash: string; cpus: number; memory_mib: number; disk_bytes: number; accel: string; qemu_version: string; cold_boot_ms: number; created_at: string }
export interface HostInfo {
  accel: string; memory_total_bytes: number; memory_available_bytes: number; memory_committed_bytes: number;
  disk_free_bytes: number; vms: Record<string, number>; running: number; suspended: number;
  warm_pool?: Record<string, number>; templates: Template[];
}

export interface BuiltTemplate {
  name: string; snapshot: string; base: string; steps: string[]; start?: string[]; ready?: string; expose?: number[];
  cpus: number; memory_mib: number; disk_bytes: number; state_bytes: number; build_ms: number; built_at: string;
  build_log?: string; dockerfile?: string;
}
