// One live stream of events for the whole console (GET /v1/events as
// server-sent events); views subscribe and unsubscribe as they come and go.
import type { AgentEvent } from './types';

type Listener = (e: AgentEvent) => void;

let source: EventSource | null = null;
const listeners = new Set<Listener>();
let onOpen: (() => void)[] = [];

export function startEvents(): void {
  stopEvents();
  // The browser resumes from the last id after a reconnect (Last-Event-ID).
  source = new EventSource('/v1/events?follow=1', { withCredentials: true });
  source.onopen = () => { for (const fn of onOpen) fn(); };
  source.onmessage = (m: MessageEvent<string>) => {
    let e: AgentEvent;
    try { e = JSON.parse(m.data); } catch { return; }
    for (const fn of [...listeners]) fn(e);
  };
}

export function stopEvents(): void {
  source?.close();
  source = null;
}

export function liveState(): 'live' | 'connecting' | 'off' {
  if (!source) return 'off';
  return source.readyState === EventSource.OPEN ? 'live' : 'connecting';
}

export function subscribe(fn: Listener): () => void {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

export function whenOpen(fn: () => void): () => void {
  onOpen.push(fn);
  return () => { onOpen = onOpen.filter((f) => f !== fn); };
}
