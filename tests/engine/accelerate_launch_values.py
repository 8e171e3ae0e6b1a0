"""Recorded from accelerate 1.15.0 by tests/parity_scripts/record_accelerate_launch.py: the files `accelerate config` writes,
and the torchrun settings and worker variables `accelerate launch` derives from flags and files."""

ACCELERATE_VERSION = '1.15.0'
PORT = '29471'
CONFIG_TEXTS = {'deepspeed': 'compute_environment: LOCAL_MACHINE\n'
              'debug: false\n'
              'deepspeed_config:\n'
              '  gradient_accumulation_steps: 1\n'
              '  offload_optimizer_device: none\n'
              '  offload_param_device: none\n'
              '  zero3_init_flag: false\n'
              '  zero_stage: 2\n'
              'distributed_type: DEEPSPEED\n'
              'downcast_bf16: false\n'
              'enable_cpu_affinity: false\n'
              'machine_rank: 0\n'
              'main_process_port: 29471\n'
              'main_training_function: main\n'
              'mixed_precision: bf16\n'
              'num_machines: 1\n'
              'num_processes: 2\n'
              'rdzv_backend: static\n'
              'same_network: true\n'
              'tpu_use_cluster: false\n'
              'tpu_use_sudo: false\n'
              'use_cpu: false\n',
 'default': '{\n'
            '  "compute_environment": "LOCAL_MACHINE",\n'
            '  "debug": false,\n'
            '  "distributed_type": "NO",\n'
            '  "downcast_bf16": false,\n'
            '  "enable_cpu_affinity": false,\n'
            '  "machine_rank": 0,\n'
            '  "main_training_function": "main",\n'
            '  "mixed_precision": "bf16",\n'
            '  "num_machines": 1,\n'
            '  "num_processes": 1,\n'
            '  "rdzv_backend": "static",\n'
            '  "same_network": false,\n'
            '  "tpu_use_cluster": false,\n'
            '  "tpu_use_sudo": false,\n'
            '  "use_cpu": true\n'
            '}\n',
 'fsdp': 'compute_environment: LOCAL_MACHINE\n'
         'debug: true\n'
         'distributed_type: FSDP\n'
         'downcast_bf16: false\n'
         'enable_cpu_affinity: false\n'
         'fsdp_config:\n'
         '  fsdp_offload_params: false\n'
         '  fsdp_reshard_after_forward: true\n'
         '  fsdp_state_dict_type: SHARDED_STATE_DICT\n'
         '  fsdp_version: 2\n'
         'machine_rank: 0\n'
         'main_process_port: 29471\n'
         'main_training_function: main\n'
         "mixed_precision: 'no'\n"
         'num_machines: 1\n'
         'num_processes: 2\n'
         'rdzv_backend: static\n'
         'same_network: true\n'
         'tpu_use_cluster: false\n'
         'tpu_use_sudo: false\n'
         'use_cpu: false\n',
 'multi_node': 'compute_environment: LOCAL_MACHINE\n'
               'debug: false\n'
               'distributed_type: MULTI_GPU\n'
               'downcast_bf16: false\n'
               'enable_cpu_affinity: false\n'
               'gpu_ids: all\n'
               'machine_rank: 1\n'
               'main_process_ip: 10.0.0.1\n'
               'main_process_port: 29471\n'
               'main_training_function: main\n'
               'mixed_precision: fp16\n'
               'num_machines: 2\n'
               'num_processes: 8\n'
               'rdzv_backend: static\n'
               'same_network: true\n'
               'tpu_use_cluster: false\n'
               'tpu_use_sudo: false\n'
               'use_cpu: false\n',
 'parallelism': 'compute_environment: LOCAL_MACHINE\n'
                'debug: false\n'
                'distributed_type: FSDP\n'
                'downcast_bf16: false\n'
                'enable_cpu_affinity: false\n'
                'fsdp_config:\n'
                '  fsdp_version: 2\n'
                'machine_rank: 0\n'
                'main_process_port: 29471\n'
                'main_training_function: main\n'
                "mixed_precision: 'no'\n"
                'num_machines: 1\n'
                'num_processes: 4\n'
                'parallelism_config:\n'
                '  parallelism_config_cp_size: 1\n'
                '  parallelism_config_dp_replicate_size: 1\n'
                '  parallelism_config_dp_shard_size: 2\n'
                '  parallelism_config_tp_size: 2\n'
                'rdzv_backend: static\n'
                'same_network: true\n'
                'tpu_use_cluster: false\n'
                'tpu_use_sudo: false\n'
                'use_cpu: false\n'}
FLAG_CASES = {'hyphens': ['--multi-gpu', '--num-processes', '2', '--mixed-precision', 'bf16'],
 'mixed_precision': ['--multi_gpu', '--num_processes', '2', '--mixed_precision', 'fp16'],
 'multi_node': ['--multi_gpu',
                '--num_processes',
                '8',
                '--num_machines',
                '2',
                '--machine_rank',
                '1',
                '--main_process_ip',
                '10.0.0.1',
                '--main_process_port',
                '29471'],
 'num_processes': ['--multi_gpu', '--num_processes', '2'],
 'parallelism': ['--use_fsdp',
                 '--fsdp_version',
                 '2',
                 '--num_processes',
                 '4',
                 '--use_parallelism_config',
                 '--parallelism_config_dp_shard_size',
                 '2',
                 '--parallelism_config_tp_size',
                 '2'],
 'use_deepspeed': ['--use_deepspeed',
                   '--num_processes',
                   '2',
                   '--zero_stage',
                   '3',
                   '--deepspeed_config_file',
                   'ds_config.json'],
 'use_fsdp': ['--use_fsdp', '--num_processes', '2']}
FLAG_RESULTS = {'hyphens': {'env': {'ACCELERATE_MIXED_PRECISION': 'bf16'},
             'torchrun': {'master_addr': None,
                          'master_port': '29500',
                          'nnodes': None,
                          'node_rank': None,
                          'nproc_per_node': '2',
                          'rdzv_backend': 'static',
                          'rdzv_endpoint': None}},
 'mixed_precision': {'env': {'ACCELERATE_MIXED_PRECISION': 'fp16'},
                     'torchrun': {'master_addr': None,
                                  'master_port': '29500',
                                  'nnodes': None,
                                  'node_rank': None,
                                  'nproc_per_node': '2',
                                  'rdzv_backend': 'static',
                                  'rdzv_endpoint': None}},
 'multi_node': {'env': {'ACCELERATE_MIXED_PRECISION': 'no'},
                'torchrun': {'master_addr': None,
                             'master_port': None,
                             'nnodes': '2',
                             'node_rank': 1,
                             'nproc_per_node': '4',
                             'rdzv_backend': 'static',
                             'rdzv_endpoint': '10.0.0.1:29471'}},
 'num_processes': {'env': {'ACCELERATE_MIXED_PRECISION': 'no'},
                   'torchrun': {'master_addr': None,
                                'master_port': '29500',
                                'nnodes': None,
                                'node_rank': None,
                                'nproc_per_node': '2',
                                'rdzv_backend': 'static',
                                'rdzv_endpoint': None}},
 'parallelism': {'env': {'ACCELERATE_MIXED_PRECISION': 'no',
                         'ACCELERATE_USE_FSDP': 'true',
                         'ACCELERATE_USE_PARALLELISM_CONFIG': 'true',
                         'FSDP_VERSION': '2',
                         'PARALLELISM_CONFIG_CP_BACKEND': 'torch',
                         'PARALLELISM_CONFIG_CP_SIZE': '1',
                         'PARALLELISM_CONFIG_DP_REPLICATE_SIZE': '1',
                         'PARALLELISM_CONFIG_DP_SHARD_SIZE': '2',
                         'PARALLELISM_CONFIG_SP_BACKEND': 'deepspeed',
                         'PARALLELISM_CONFIG_SP_SIZE': '1',
                         'PARALLELISM_CONFIG_TP_SIZE': '2'},
                 'torchrun': {'master_addr': None,
                              'master_port': '29500',
                              'nnodes': None,
                              'node_rank': None,
                              'nproc_per_node': '4',
                              'rdzv_backend': 'static',
                              'rdzv_endpoint': None}},
 'use_deepspeed': {'env': {'ACCELERATE_CONFIG_DS_FIELDS': '',
                           'ACCELERATE_DEEPSPEED_CONFIG_FILE': 'ds_config.json',
                           'ACCELERATE_DEEPSPEED_ZERO_STAGE': '3',
                           'ACCELERATE_MIXED_PRECISION': 'no',
                           'ACCELERATE_USE_DEEPSPEED': 'true'},
                   'torchrun': {'master_addr': None,
                                'master_port': '29500',
                                'nnodes': None,
                                'node_rank': None,
                                'nproc_per_node': '2',
                                'rdzv_backend': 'static',
                                'rdzv_endpoint': None}},
 'use_fsdp': {'env': {'ACCELERATE_MIXED_PRECISION': 'no', 'ACCELERATE_USE_FSDP': 'true', 'FSDP_VERSION': '1'},
              'torchrun': {'master_addr': None,
                           'master_port': '29500',
                           'nnodes': None,
                           'node_rank': None,
                           'nproc_per_node': '2',
                           'rdzv_backend': 'static',
                           'rdzv_endpoint': None}}}
FILE_RESULTS = {'deepspeed': {'env': {'ACCELERATE_CONFIG_DS_FIELDS': 'gradient_accumulation_steps,offload_optimizer_device,offload_param_device,zero3_init_flag,zero_stage,mixed_precision',
                       'ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE': 'none',
                       'ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE': 'none',
                       'ACCELERATE_DEEPSPEED_ZERO3_INIT': 'false',
                       'ACCELERATE_DEEPSPEED_ZERO_STAGE': '2',
                       'ACCELERATE_GRADIENT_ACCUMULATION_STEPS': '1',
                       'ACCELERATE_MIXED_PRECISION': 'bf16',
                       'ACCELERATE_USE_DEEPSPEED': 'true'},
               'torchrun': {'master_addr': None,
                            'master_port': '29471',
                            'nnodes': None,
                            'node_rank': None,
                            'nproc_per_node': '2',
                            'rdzv_backend': 'static',
                            'rdzv_endpoint': None}},
 'fsdp': {'env': {'ACCELERATE_DEBUG_MODE': 'true',
                  'ACCELERATE_MIXED_PRECISION': 'no',
                  'ACCELERATE_USE_FSDP': 'true',
                  'FSDP_VERSION': '2'},
          'torchrun': {'master_addr': None,
                       'master_port': '29471',
                       'nnodes': None,
                       'node_rank': None,
                       'nproc_per_node': '2',
                       'rdzv_backend': 'static',
                       'rdzv_endpoint': None}},
 'multi_node': {'env': {'ACCELERATE_MIXED_PRECISION': 'fp16'},
                'torchrun': {'master_addr': None,
                             'master_port': None,
                             'nnodes': '2',
                             'node_rank': 1,
                             'nproc_per_node': '4',
                             'rdzv_backend': 'static',
                             'rdzv_endpoint': '10.0.0.1:29471'}},
 'parallelism': {'env': {'ACCELERATE_MIXED_PRECISION': 'no',
                         'ACCELERATE_USE_FSDP': 'true',
                         'ACCELERATE_USE_PARALLELISM_CONFIG': 'true',
                         'FSDP_VERSION': '2',
                         'PARALLELISM_CONFIG_CP_BACKEND': 'torch',
                         'PARALLELISM_CONFIG_CP_SIZE': '1',
                         'PARALLELISM_CONFIG_DP_REPLICATE_SIZE': '1',
                         'PARALLELISM_CONFIG_DP_SHARD_SIZE': '2',
                         'PARALLELISM_CONFIG_SP_BACKEND': 'deepspeed',
                         'PARALLELISM_CONFIG_SP_SIZE': '1',
                         'PARALLELISM_CONFIG_TP_SIZE': '2'},
                 'torchrun': {'master_addr': None,
                              'master_port': '29471',
                              'nnodes': None,
                              'node_rank': None,
                              'nproc_per_node': '4',
                              'rdzv_backend': 'static',
                              'rdzv_endpoint': None}}}
