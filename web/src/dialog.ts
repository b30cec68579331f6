// Modal dialogs on the native <dialog> element: focus moves into it,
// Escape cancels, focus returns to what opened it.
import { h, field } from './dom';

export interface Prompt {
  label: string;
  value?: string;
  type?: string;
  hint?: string;
  name: string;
  min?: number;
}

// ask shows a dialog; it resolves to the entered values, or null when cancelled.
export function ask(title: string, message: string, fields: Prompt[], confirm = 'OK', danger = false): Promise<Record<string, string> | null> {
  return new Promise((resolve) => {
    const back = document.activeElement as HTMLElement | null;
    const inputs = fields.map((f) => {
      const i = h('input', { type: f.type ?? 'text', name: f.name, value: f.value ?? '', min: f.min ?? null });
      return { f, i };
    });
    const ok = h('button', { type: 'submit', class: danger ? 'danger' : 'primary' }, confirm);
    const cancel = h('button', { type: 'button' }, 'Cancel');
    const titleId = `dlg-${Math.random().toString(36).slice(2)}`;
    const form = h('form', { method: 'dialog' },
      h('h2', { id: titleId }, title),
      message ? h('p', null, message) : null,
      inputs.map(({ f, i }) => field(f.label, i, f.hint)),
      h('div', { class: 'buttons' }, ok, cancel));
    const dlg = h('dialog', { 'aria-labelledby': titleId }, form);
    let result: Record<string, string> | null = null;
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      result = {};
      for (const { f, i } of inputs) result[f.name] = i.value;
      dlg.close();
    });
    cancel.addEventListener('click', () => dlg.close());
    dlg.addEventListener('close', () => {
      dlg.remove();
      back?.focus();
      resolve(result);
    });
    document.body.appendChild(dlg);
    dlg.showModal();
    (inputs[0]?.i ?? ok).focus();
  });
}

export async function confirmAction(title: string, message: string, confirm: string): Promise<boolean> {
  return (await ask(title, message, [], confirm, true)) !== null;
}
