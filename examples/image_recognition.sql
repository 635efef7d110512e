-- Incremental image recognition over a volume stream: the seed's example, statements as written.
--
-- Source: the seed system's Volume Stream documentation (ClickZetta / Singdata Lakehouse, "Example:
-- Incremental Analysis of OSS Images"). Images land in an OSS bucket; OSS event notifications reach
-- an MNS queue; the volume's directory table follows them; a STANDARD stream over the volume feeds
-- an INSERT that calls an image-recognition function on every new or replaced image. The INSERT
-- moves the stream's offset only when it succeeds, so running it again (by cron, Airflow, a loop)
-- processes each image once. Every CREATE says IF NOT EXISTS (the seed's grammar allows it), so the
-- whole script can be run again as it is: what exists is left as it is (OR REPLACE would make a new
-- connection external id and a new, empty directory table).
--
-- The AI function `public.fc_image_to_text(task, url)` is, in the seed, a cloud function. Here it is
-- a Python UDF registered under the same name before the script runs:
--
--     cat = volume_stream.connect("./warehouse")
--     cat.register_udf("fc_image_to_text", my_recogniser, "string")   # my_recogniser(task, url)
--     cat.sql(open("examples/image_recognition.sql").read())
--
-- or from the command line:
--
--     volume-stream sql examples/image_recognition.sql --udf fc_image_to_text=my_module:my_recogniser
--
-- The connection, bucket, queue and role below are the seed's; replace them with yours. The
-- connection holds no secret (a role ARN); `ACCESS_ID = ENV('VAR')` would reference a variable.
-- To try the same pipeline on a laptop, swap statement 3 for a local folder watched by inotify:
--
--     CREATE EXTERNAL VOLUME IF NOT EXISTS vol_dish_images
--       LOCATION '/path/to/dish-images/'
--       NOTIFICATION = (QUEUE_TYPE = 'LOCAL', VIRTUAL_CLUSTER = 'DEFAULT')
--       DIRECTORY = (ENABLE = TRUE)
--       RECURSIVE = TRUE;
--
-- and let `volume-stream watch vol_dish_images` (or `ALTER VOLUME vol_dish_images REFRESH`) feed it.

-- 1. Storage connection (assumes a RAM role; no access keys are stored)
CREATE STORAGE CONNECTION IF NOT EXISTS conn_sh_oss
  TYPE OSS
  REGION = 'cn-shanghai'
  ROLE_ARN = 'acs:ram::1450476637304722:role/czvolumestreamrole' -- Replace with your own RoleARN
  ENDPOINT = 'oss-cn-shanghai.aliyuncs.com';

-- 2. The external id to put in the role's trust policy
DESCRIBE CONNECTION conn_sh_oss;

-- 3. The volume: OSS images, MNS event notifications, a directory table
CREATE EXTERNAL VOLUME IF NOT EXISTS vol_dish_images
  LOCATION 'oss://sh-oss-derek/dish-images/'
  USING CONNECTION conn_sh_oss
  NOTIFICATION = (
    QUEUE_TYPE    = 'ALICLOUD_MNS',
    QUEUE_NAME    = 'cz-queue-mns-ossevent',
    VIRTUAL_CLUSTER = 'DEFAULT'
  )
  DIRECTORY = (ENABLE = TRUE)
  RECURSIVE = TRUE;

-- 4. Where recognition results go (a Spark table in the current database)
CREATE TABLE IF NOT EXISTS dish_recognition_results (
    file_path          VARCHAR        COMMENT 'Relative path of the image',
    file_url           VARCHAR        COMMENT 'Full OSS URL of the image',
    file_size          BIGINT         COMMENT 'File size (bytes)',
    last_modified_time TIMESTAMP      COMMENT 'File last modified time',
    recognized_content VARCHAR        COMMENT 'AI recognition result',
    change_type        VARCHAR        COMMENT 'Trigger event type: INSERT/UPDATE_AFTER',
    commit_version     BIGINT         COMMENT 'Stream consumption version number',
    processed_at       TIMESTAMP      COMMENT 'Processing time'
);

-- 5. The stream: STANDARD sees new images (INSERT) and replaced ones (UPDATE_AFTER)
CREATE STREAM IF NOT EXISTS str_dish_images
  ON VOLUME vol_dish_images
  WITH PROPERTIES ('TABLE_STREAM_MODE' = 'STANDARD');

-- 6. Consume: recognise new and replaced images; the stream's offset moves when this succeeds
INSERT INTO dish_recognition_results
SELECT
    relative_path   AS file_path,
    url   AS file_url,
    size   AS file_size,
    last_modified_time,
    public.fc_image_to_text('dish_recognition', url) AS recognized_content,
    __change_type  AS change_type,
    __commit_version  AS commit_version,
    current_timestamp() AS processed_at
FROM str_dish_images
WHERE __change_type IN ('INSERT', 'UPDATE_AFTER')  -- skip DELETE / UPDATE_BEFORE
  AND (
       lower(relative_path) LIKE '%.jpg'
    OR lower(relative_path) LIKE '%.jpeg'
    OR lower(relative_path) LIKE '%.png'
    OR lower(relative_path) LIKE '%.webp'
  );

-- 7. The latest results
SELECT
    file_path,
    recognized_content,
    change_type,
    processed_at
FROM dish_recognition_results
ORDER BY processed_at DESC
LIMIT 20;

-- 8. Results per recognised dish
SELECT
    recognized_content,
    COUNT(*) AS cnt
FROM dish_recognition_results
GROUP BY recognized_content
ORDER BY cnt DESC;
