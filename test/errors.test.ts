// The error classes: one TorporError per failure with a stable code, the most specific class for
// each code (createError is how the addon's errors become these), and E2B's class names so code
// ported from E2B catches torpor's errors as it caught E2B's.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import * as torpor from '../lib/index.js';

test("createError builds the code's class; not-found codes share NotFoundError; SANDBOX_BUSY has its class", () => {
  const cases: Array<[string, new (...a: never[]) => Error]> = [
    ['FILE_NOT_FOUND', torpor.FileNotFoundError],
    ['SANDBOX_NOT_FOUND', torpor.SandboxNotFoundError],
    ['TEMPLATE_NOT_FOUND', torpor.TemplateNotFoundError],
    ['SANDBOX_BUSY', torpor.SandboxBusyError],
    ['INVALID_ARGUMENT', torpor.InvalidArgumentError],
  ];
  for (const [code, Class] of cases) {
    const err = torpor.createError(code, 'm', 2);
    assert.ok(err instanceof Class, code);
    assert.ok(err instanceof torpor.TorporError, code);
    assert.is(err.code, code);
    assert.is(err.errno, 2);
    assert.is(err.name, Class.name);
  }
  for (const code of ['FILE_NOT_FOUND', 'SANDBOX_NOT_FOUND', 'TEMPLATE_NOT_FOUND']) assert.ok(torpor.createError(code, 'm') instanceof torpor.NotFoundError, code);
  assert.not.ok(torpor.createError('SANDBOX_BUSY', 'm') instanceof torpor.NotFoundError);
  assert.is(torpor.createError('SOMETHING_NEW', 'm').constructor, torpor.TorporError, 'an unknown code is still a TorporError');
});

test("E2B's names: SandboxError is TorporError, NotFoundError catches every not-found", () => {
  assert.is(torpor.SandboxError, torpor.TorporError);
  const busy = new torpor.SandboxBusyError('in use by process 7', { ownerPid: 7 });
  assert.ok(busy instanceof torpor.SandboxError);
  assert.is(busy.ownerPid, 7);
  assert.is(new torpor.SandboxBusyError('m').ownerPid, null);
});

test.run();
