/* The C ABI from an installed package: views, a copy, errors and the release callback called exactly once. */
#include <tensorwire/tensorwire.h>
#include <stdio.h>
#include <string.h>
static int released = 0;
static void rel(void* ctx) { (void)ctx; released++; }
int main(void) {
  float buf[6] = {0, 1, 2, 3, 4, 5};
  int64_t shape[2] = {2, 3};
  DLDataType f32 = {kDLFloat, 32, 1};
  DLDevice cpu = {kDLCPU, 0};
  tw_tensor *t = NULL, *v = NULL, *c = NULL;
  if (tw_tensor_from_blob(buf, 2, shape, NULL, f32, cpu, rel, NULL, &t) != TW_OK) return 1;
  int64_t perm[2] = {1, 0};
  if (tw_tensor_permute(t, perm, 2, &v) != TW_OK) return 2;
  if (tw_tensor_contiguous(v, &c) != TW_OK) return 3;
  if (((float*)tw_tensor_data(c))[1] != 3.0f) return 4;
  tw_tensor* bad = NULL;
  if (tw_tensor_permute(t, perm, 1, &bad) == TW_OK || bad != NULL || strlen(tw_last_error()) == 0) return 5;
  tw_tensor_free(t); tw_tensor_free(v); tw_tensor_free(c);
  if (released != 1) return 6;
  printf("capi ok %s\n", tw_version());
  return 0;
}
