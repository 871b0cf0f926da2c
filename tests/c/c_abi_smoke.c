/* The C ABI from C: tensorwire.h compiles as C99 with -pedantic, and the export policy behaves as documented. */
#include <stdio.h>
#include <string.h>

#include "tensorwire/tensorwire.h"

static int failures = 0;
#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                           \
    }                                                                       \
  } while (0)

int main(void) {
  const int64_t shape[2] = {3, 4};
  const DLDataType f32 = {kDLFloat, 32, 1};
  tw_tensor *t = NULL, *rev = NULL, *ro = NULL;
  DLManagedTensorVersioned* m = NULL;
  int copied = -1;
  tw_export_options opt;

  CHECK(tw_version()[0] != '\0');
  CHECK(tw_tensor_zeros(2, shape, f32, &t) == TW_OK);
  CHECK(tw_tensor_slice(t, 0, 2, -4, -1, &rev) == TW_OK); /* rows reversed: stride -4 */
  CHECK(tw_tensor_strides(rev)[0] == -4);

  /* Default (portable) export: negative strides are copied, and the struct says so. */
  CHECK(tw_tensor_export_dlpack(rev, NULL, &m, &copied) == TW_OK);
  CHECK(copied == 1 && m->dl_tensor.strides[0] == 4 && (m->flags & DLPACK_FLAG_BITMASK_IS_COPIED));
  CHECK(m->version.major == 1 && m->version.minor == DLPACK_MINOR_VERSION);
  m->deleter(m);

  /* A strided consumer takes them as they are. */
  tw_export_options_init(&opt);
  opt.consumer = TW_CONSUMER_STRIDED;
  CHECK(tw_tensor_export_dlpack(rev, &opt, &m, &copied) == TW_OK);
  CHECK(copied == 0 && m->dl_tensor.strides[0] == -4);
  m->deleter(m);

  /* copy forbidden: the copy the portable profile needs is refused with a message naming why. */
  tw_export_options_init(&opt);
  opt.copy = TW_COPY_NEVER;
  CHECK(tw_tensor_export_dlpack(rev, &opt, &m, &copied) == TW_ERR_COPY_REQUIRED);
  CHECK(m == NULL && strstr(tw_last_error(), "negative") != NULL);

  /* A struct_size the library does not know is refused, not misread. */
  tw_export_options_init(&opt);
  opt.struct_size = 3;
  CHECK(tw_tensor_export_dlpack(t, &opt, &m, NULL) == TW_ERR_INVALID_ARGUMENT);

  /* Read-only tensors go out versioned and flagged; a legacy struct cannot say so and is refused. */
  CHECK(tw_tensor_as_readonly(t, &ro) == TW_OK);
  CHECK(tw_tensor_export_dlpack(ro, NULL, &m, NULL) == TW_OK);
  CHECK((m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
  m->deleter(m);
  {
    DLManagedTensor* legacy = NULL;
    CHECK(tw_tensor_export_dlpack_legacy(ro, NULL, &legacy) == TW_ERR_UNSUPPORTED && legacy == NULL);
  }

  tw_tensor_free(ro);
  tw_tensor_free(rev);
  tw_tensor_free(t);
  if (failures) return 1;
  printf("C ABI smoke: ok\n");
  return 0;
}
