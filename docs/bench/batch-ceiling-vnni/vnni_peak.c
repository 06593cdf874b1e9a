// The int8 multiply-add peak of this CPU: ten independent 512-bit vpdpbusd chains per thread (inline asm, so the
// compiler cannot merge them), one thread per core. gcc -O2 -mavx512f -mavx512vnni -fopenmp vnni_peak.c; OMP_NUM_THREADS=2 ./a.out
#include <stdio.h>
#include <time.h>
#include <omp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  long iters=100000000; double best=0;
  for(int rep=0;rep<3;rep++){
  double t0=now(); int nt=1;
  #pragma omp parallel
  {
    #pragma omp single
    nt=omp_get_num_threads();
    for(long i=0;i<iters/10;i++){
      __asm__ volatile(
        "vpdpbusd %%zmm30,%%zmm31,%%zmm0\n vpdpbusd %%zmm30,%%zmm31,%%zmm1\n vpdpbusd %%zmm30,%%zmm31,%%zmm2\n vpdpbusd %%zmm30,%%zmm31,%%zmm3\n vpdpbusd %%zmm30,%%zmm31,%%zmm4\n"
        "vpdpbusd %%zmm30,%%zmm31,%%zmm5\n vpdpbusd %%zmm30,%%zmm31,%%zmm6\n vpdpbusd %%zmm30,%%zmm31,%%zmm7\n vpdpbusd %%zmm30,%%zmm31,%%zmm8\n vpdpbusd %%zmm30,%%zmm31,%%zmm9\n"
        ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9");
    }
  }
  double s=now()-t0; double g=(double)iters*64*nt/s/1e9; if(g>best)best=g;}
  printf("vpdpbusd zmm: %.0f G MAC/s\n",best);
}
